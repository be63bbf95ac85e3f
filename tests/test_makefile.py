"""What the Makefile's variables reach: each make command line (`make -n`) read by the parser of the
command it runs, so a variable that is dropped, misspelt or passed to the wrong option fails here; and
`make sweep` run to its report."""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import shlex
import subprocess

import pytest
from conftest import REPO

from runners.__main__ import microbatch_counts
from runners.__main__ import parser as runners_parser
from runners.inject import parse_injections
from runners.presets import CALIBRATED_MS
from runners.request import RunRequest, request_from

P = 2  # make passes --p only when P is set; the request needs one either way


def command_line(target: str, *variables: str, module: str) -> list[str]:
    """The arguments `make -n target variables...` gives `python -m module` (the target first)."""
    result = subprocess.run(["make", "-n", target, *variables], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    (line,) = [
        line for line in result.stdout.replace("\\\n", " ").splitlines() if f" -m {module} {target}" in line
    ]
    words = shlex.split(line)
    return words[words.index(module) + 1 :]


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


@pytest.mark.slow
def test_make_sweep_runs_each_m_and_reports_them(tmp_path):
    """`make sweep` in a folder of its own (the Makefile's paths are relative: its traces/ and reports/
    land there; the checkout's .venv and pyproject.toml are linked in, so setup has nothing to do)."""
    for name in (".venv", "pyproject.toml"):
        (tmp_path / name).symlink_to(REPO / name)
    variables = ["SCHED=gpipe", "P=2", "MS=1 2", "PRESET=tiny", "DEVICE=cpu", "STEPS=1"]
    result = subprocess.run(
        ["make", "-f", str(REPO / "Makefile"), "sweep", *variables],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    runs = sorted(path for path in (tmp_path / "traces").iterdir() if path.name != "latest")
    configs = [json.loads((run / "run.json").read_text()) for run in runs]
    assert [(c["complete"], c["schedule"], c["p"], c["m"], c["preset"], c["device"]) for c in configs] == [
        (True, "gpipe", 2, m, "tiny", "cpu") for m in (1, 2)
    ]
    index = (tmp_path / "reports" / "index.html").read_text()
    assert all(
        run.name in index and (tmp_path / "reports" / "runs" / f"{run.name}.html").exists() for run in runs
    )
