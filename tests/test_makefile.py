"""What the Makefile's variables reach: each make command line (`make -n`) read by the parser of the
command it runs, so a variable that is dropped, misspelt or passed to the wrong option fails here; any
value reaches its command as one word, which refuses it in one line; `make trace` works on the run it
made; and `make sweep` run to its report."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO

from runners.__main__ import microbatch_counts
from runners.__main__ import parser as runners_parser
from runners.inject import parse_injections
from runners.presets import CALIBRATED_MS
from runners.request import RunRequest, request_from

P = 2  # make passes --p only when P is set; the request needs one either way


def command_line(target: str, *variables: str, module: str) -> list[str]:
    """The arguments `make -n target variables...` gives `python -m module` (the target first), read as
    the shell reads them: up to the shell's next operator (`)`, `&&`, `;`)."""
    result = subprocess.run(["make", "-n", target, *variables], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    (line,) = [
        line for line in result.stdout.replace("\\\n", " ").splitlines() if f" -m {module} {target}" in line
    ]
    words = list(shlex.shlex(line, posix=True, punctuation_chars=True))
    words = words[words.index(module) + 1 :]
    ends = [i for i, word in enumerate(words) if set(word) <= set("();<>|&")]
    return words[: ends[0] if ends else None]


def runner_args(target: str, *variables: str) -> argparse.Namespace:
    return runners_parser().parse_args(command_line(target, *variables, module="runners"))


def make_request(*variables: str) -> RunRequest:
    """The request `make trace variables...` starts."""
    args = runner_args("trace", *variables)
    return request_from(args, args.p or P)


# Each request variable, a value unlike its default, and the RunRequest field it must set to what.
VARIABLES = [
    ("SCHED=1f1b", "schedule", "1f1b"),
    ("M=5", "m", 5),
    ("P=3", "p", 3),
    ("DP=2", "dp", 2),
    ("DP_OVERLAP=1", "dp_overlap", True),
    ("CALIBRATE_ADVICE=1", "calibrate_advice", True),
    ("V=2", "v", 2),
    ("PRESET=tiny", "preset", "tiny"),
    ("ENGINE=torch", "engine", "torch"),
    ("STEPS=7", "steps", 7),
    ("DEVICE=cpu", "device", "cpu"),
    ("ROWS_PER_MB=16", "rows_per_microbatch", 16),
    ("INJECT=host:1:20", "injections", parse_injections("host:1:20")),
    ("MODEL=runners.examples.transformer_block:stage", "model", "runners.examples.transformer_block:stage"),
]


@pytest.mark.parametrize(
    ("variable", "field", "value"), VARIABLES, ids=[v[0].split("=")[0] for v in VARIABLES]
)
def test_each_request_variable_reaches_the_runner_and_changes_only_its_field(variable, field, value):
    plain, changed = make_request(), make_request(variable)
    assert getattr(changed, field) == value != getattr(plain, field)
    assert dataclasses.replace(changed, **{field: getattr(plain, field)}) == plain


def test_the_makefiles_defaults_are_the_runners_own():
    """`make trace` with nothing set asks for what `python -m runners trace --sched gpipe --m 8` does."""
    made = make_request()
    direct = runners_parser().parse_args("trace --sched gpipe --m 8".split())
    assert made == request_from(direct, P)


def test_ms_reaches_sweep_and_defaults_to_the_calibrated_counts():
    assert microbatch_counts(runner_args("sweep", "MS=1 4").ms) == [1, 4]
    assert microbatch_counts(runner_args("sweep").ms) == list(CALIBRATED_MS)


def analysis_args(command: str, *variables: str) -> argparse.Namespace:
    """What `make -n command variables...` gives `python -m analysis command`, read by its parser."""
    parser = argparse.ArgumentParser()
    importlib.import_module(f"analysis.cli.{command}").add_arguments(parser)
    return parser.parse_args(command_line(command, *variables, module="analysis")[1:])


@pytest.mark.parametrize("command", ["predict", "advise"])
def test_run_and_ms_reach_predict_and_advise_and_ms_defaults_to_their_own(command):
    assert analysis_args(command, "MS=2 8", "RUN=traces/m4").ms == [2, 8]
    assert analysis_args(command, "RUN=traces/m4").run_dir.as_posix() == "traces/m4"
    assert analysis_args(command).ms == list(CALIBRATED_MS)  # make's default MS is the command's own


def test_memory_mb_reaches_advise():
    assert analysis_args("advise", "MEMORY_MB=512").memory_mb == 512
    assert analysis_args("advise").memory_mb is None


def test_a_b_and_fail_on_reach_diff():
    found = analysis_args("diff", "A=traces/a", "B=traces/b c", "FAIL_ON=step_time:+5%")
    assert (found.a.as_posix(), found.b.as_posix(), found.fail_on) == (
        "traces/a",
        "traces/b c",
        "step_time:+5%",
    )
    assert analysis_args("diff", "A=traces/a", "B=traces/b").fail_on is None


def test_values_with_spaces_quotes_or_shell_syntax_reach_their_command_as_one_word():
    """`MODEL='a:b;touch X;#'` ran `touch X`; `RUN="a b"` was two paths."""
    assert make_request("MODEL=a:b;touch X;#").model == "a:b;touch X;#"
    assert analysis_args("predict", "RUN=runs/a b's").run_dir.as_posix() == "runs/a b's"
    assert command_line("advise", "MEMORY_MB=1;x", module="analysis")[-2:] == ["--memory-mb", "1;x"]


def make_command(folder: Path, target: str, *variables: str) -> list[str]:
    """`make target variables...` to run in `folder`, a folder of its own (the Makefile's paths are
    relative: its traces/ and reports/ land there; the checkout's .venv and pyproject.toml are linked
    in, so setup has nothing to do)."""
    for name in (".venv", "pyproject.toml"):
        if not (folder / name).exists():
            (folder / name).symlink_to(REPO / name)
    return ["make", "-f", str(REPO / "Makefile"), target, *variables]


def make_in(folder: Path, target: str, *variables: str) -> subprocess.Popen:
    return subprocess.Popen(
        make_command(folder, target, *variables),
        cwd=folder,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def ours_of(err: str) -> list[str]:
    """stderr's lines less make's own (`make: ***`, or `make[1]: ***` under another make: `make test`)."""
    return [line for line in err.splitlines() if not re.match(r"make(\[\d+\])?: ", line)]


@pytest.mark.parametrize(
    "variable, words",
    [
        ("M=abc", "error: argument --m/--microbatches: not a whole number: 'abc'"),
        ("CALIBRATE_ADVICE=yes", "error: argument --calibrate-advice: 1 or 0, not 'yes'"),
        ("DP_OVERLAP=true", "error: argument --dp-overlap: 1 or 0, not 'true'"),
        ("MODEL=a:b;touch X;#", "error: --model 'a:b;touch X;#': write package.module:factory"),
    ],
)
def test_a_value_that_is_none_stops_make_trace_with_the_runners_one_line(tmp_path, variable, words):
    """Before: `M=abc` printed argparse's usage block, `CALIBRATE_ADVICE=yes` was silently 0, and the
    MODEL ran `touch X`, then analysed the previous run and exited 0."""
    made = make_in(tmp_path, "trace", "DEVICE=cpu", variable)
    _, err = made.communicate(timeout=120)
    ours = ours_of(err)
    assert made.returncode == 2 and ours == [ours[0]] and ours[0].startswith(words), err
    assert not (tmp_path / "X").exists() and not (tmp_path / "traces").exists()


# Runs argv[2:] under an address-space limit of argv[1] bytes (a request that would exhaust the machine
# dies of MemoryError instead), then prints its and its descendants' CPU seconds and peak resident bytes.
# A process of its own: a child's peak counts what it held between fork and exec, which for a child
# of the test process is the test process's own (560 MB in a whole `make test`).
COST_OF = """
import os, resource, subprocess, sys
limit = int(sys.argv[1])
child = subprocess.Popen(sys.argv[2:], preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)),
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
err = child.stderr.read()
_, status, usage = os.wait4(child.pid, 0)
print(usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024)
sys.stderr.write(err)
"""


@pytest.mark.parametrize("variable", ["M=99999999999999999999", "P=1000000", "DP=1000000"])
def test_huge_requests_are_refused_by_make_trace_in_a_second_and_200_mb(tmp_path, variable):
    """The issue's bounds, in CPU time (the machine may be shared: a refusal that waits for a core is no
    slower for it) and peak memory of make and what it runs. Before, M=10**20 grew until killed and P,
    DP=10**6 built schedules of millions of actions or handed torchrun a million processes."""
    command = make_command(tmp_path, "trace", "DEVICE=cpu", variable)
    measured = subprocess.run(
        [sys.executable, "-c", COST_OF, str(2_000_000_000), *command],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    ours = ours_of(measured.stderr)
    assert len(ours) == 1 and "more than the" in ours[0], measured.stderr
    seconds, peak = map(float, measured.stdout.split())
    assert seconds < 1 and peak < 200_000_000, (seconds, peak)


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(path.relative_to(folder)): path.read_bytes() for path in folder.rglob("*") if path.is_file()}


@pytest.mark.slow
def test_make_trace_analyses_the_run_it_made_whatever_latest_is(tmp_path):
    """traces/latest copied as a directory (`cp -rL`) holding another run: the runner leaves it as it is
    (it failed the complete run with IsADirectoryError), and analyze, merge and report take the run the
    runner made (they read traces/latest, so analysed and merged that other run)."""
    other = tmp_path / "traces" / "latest"
    subprocess.run(
        [sys.executable, "-m", "synthetic", str(other), "--schedule", "1f1b", "--p", "2", "--m", "4"],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    before = snapshot(other)
    variables = ["SCHED=gpipe", "P=2", "M=2", "PRESET=tiny", "DEVICE=cpu", "STEPS=1"]
    out, err = make_in(tmp_path, "trace", *variables).communicate(timeout=600)
    (made,) = [path for path in (tmp_path / "traces").iterdir() if path.name != "latest"]
    assert f"traces: {made} " in out and "latest is not moved (not a link)" in out, err[-2000:]
    assert "gpipe p=2 m=2 v=1" in out and "1f1b" not in out
    assert (made / "analysis" / "summary.json").is_file() and (made / "merged.json.gz").is_file()
    after = snapshot(other)  # the report analysed the copy too, as it does every run under traces/
    assert {name: after.get(name) for name in before} == before and "merged.json.gz" not in after
    assert made.name in (tmp_path / "reports" / "index.html").read_text()


@pytest.mark.slow
def test_make_sweep_runs_each_m_and_reports_them(tmp_path):
    variables = ["SCHED=gpipe", "P=2", "MS=1 2", "PRESET=tiny", "DEVICE=cpu", "STEPS=1"]
    made = make_in(tmp_path, "sweep", *variables)
    _, err = made.communicate(timeout=600)
    assert made.returncode == 0, err[-2000:]
    runs = sorted(path for path in (tmp_path / "traces").iterdir() if path.name != "latest")
    configs = [json.loads((run / "run.json").read_text()) for run in runs]
    assert [(c["complete"], c["schedule"], c["p"], c["m"], c["preset"], c["device"]) for c in configs] == [
        (True, "gpipe", 2, m, "tiny", "cpu") for m in (1, 2)
    ]
    index = (tmp_path / "reports" / "index.html").read_text()
    assert all(
        run.name in index and (tmp_path / "reports" / "runs" / f"{run.name}.html").exists() for run in runs
    )
