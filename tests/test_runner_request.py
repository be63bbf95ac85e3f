"""Requests are checked before any process starts: one line, exit 2, nothing created."""

from __future__ import annotations

import inspect
import subprocess
import sys
from pathlib import Path

import pytest

import runners.request
from runners.engines import ENGINES
from runners.inject import parse_injections
from runners.launch import torchrun_command
from runners.presets import PRESETS, microbatch_rows, preset_problem
from runners.request import RequestError, RunRequest, choose_device, default_p, mode_line, resolve
from runners.schedules.single_gpu import PROCESSES, SINGLE_GPU

REPO = Path(__file__).resolve().parent.parent


def no_gpus() -> int:
    return 0


def gpus(count: int):
    return lambda: count


@pytest.mark.parametrize(
    "request_, count_gpus, words",
    [
        (RunRequest("1f1b", 4, 2), no_gpus, "m=2 < p=4"),
        (RunRequest("zb", 4, 3), no_gpus, "m=3 < p=4"),
        (RunRequest("interleaved", 2, 4, v=0), no_gpus, "v"),
        (RunRequest("gpipe", 2, 4, v=2), no_gpus, "v=2"),
        (RunRequest("interleaved", 4, 6, v=2), no_gpus, "multiple of p"),
        (RunRequest("wavefront", 2, 4), no_gpus, "unknown schedule"),
        (RunRequest("gpipe", 4, 8, device="cuda"), no_gpus, "no GPU"),
        (RunRequest("gpipe", 4, 8, engine="torch"), gpus(1), "only --engine native"),
        (RunRequest("gpipe", 2, 8, engine="megatron"), no_gpus, "unknown engine"),
        (RunRequest("gpipe", 2, 8, preset="huge"), no_gpus, "unknown preset"),
        (RunRequest("interleaved", 2, 8, v=4, preset="seed", device="cpu"), no_gpus, "v=4 must divide"),
        (RunRequest("gpipe", 2, 65, preset="tiny"), no_gpus, "m=65"),
        (RunRequest("gpipe", 2, 8, steps=0), no_gpus, "at least 1"),
        (RunRequest("gpipe", 2, 8, dp=0), no_gpus, "DP=0"),
        (RunRequest("gpipe", 2, 8, dp_overlap=True), no_gpus, "DP=1 has none"),
        (
            RunRequest("zb", 2, 8, engine="torch", dp=2, dp_overlap=True),
            no_gpus,
            "ScheduleInterleavedZeroBubble",
        ),
        (RunRequest("gpipe", 2, 8, dp=2), gpus(2), "4 ranks need 4 GPUs"),
        (RunRequest("gpipe", 2, 8, dp=2, device="cuda"), gpus(3), "single-GPU mode holds one pipeline"),
    ],
)
def test_bad_requests_are_refused_in_one_line(request_, count_gpus, words):
    with pytest.raises(RequestError) as error:
        resolve(request_, count_gpus)
    assert words in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    "request_, words",
    [
        (
            RunRequest("gpipe", 2, 99999999999999999999),
            "m=99,999,999,999,999,999,999 microbatches, more than",
        ),
        (RunRequest("gpipe", 1_000_000, 8), "1,000,000 stages, more than the 256"),
        (RunRequest("gpipe", 2, 8, dp=1_000_000), "2,000,000 ranks, more than the 1,024"),
        (RunRequest("interleaved", 2, 8, v=1_000_000, model="m:stage"), "2,000,000 stages"),
        (RunRequest("interleaved", 2, 8, v=16), "v=16 must divide"),
        (RunRequest("gpipe", 2, 8, steps=10**20), "at most 1,000"),
        (RunRequest("gpipe", 2, 8, timed_steps=10**6), "at most 1,000"),
        (RunRequest("gpipe", 2, 512, rows_per_microbatch=100_000), "GB ("),
        (RunRequest("gpipe", 2, 8, injections=parse_injections("slow:0:1000000")), "GB ("),
        (RunRequest("gpipe", 200, 8), "200 worker process(es)"),
    ],
)
def test_requests_past_what_the_analysis_or_the_machine_holds_are_refused_before_a_schedule_is_built(
    monkeypatch, request_, words
):
    """m, v, P, DP, steps and rows are bounded first: a schedule of m=10**20 (or P=10**6) is never built."""

    def build(*args):
        raise AssertionError(f"built a schedule for {args}")

    monkeypatch.setattr(runners.request, "build", build)
    monkeypatch.setattr(runners.request, "available_bytes", lambda: 24_000_000_000)
    with pytest.raises(RequestError) as error:
        resolve(request_, no_gpus)
    assert words in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--m", "abc"], "argument --m/--microbatches: not a whole number: 'abc'"),
        (["--m", "1e20"], "not a whole number: '1e20'"),
        (["--m", "8", "--steps", "inf"], "argument --steps: not a whole number: 'inf'"),
        (["--m", "8", "--v", "yes"], "argument --v/--chunks: not a whole number: 'yes'"),
        (["--m", "8", "--p", "+2"], "argument --p: not a whole number: '+2'"),
        (["--m", "8", "--dp", " 2"], "argument --dp: not a whole number: ' 2'"),
        (["--m", "8", "--rows-per-mb", "1_000"], "not a whole number: '1_000'"),
        (["--m", "8", "--calibrate-advice", "yes"], "argument --calibrate-advice: 1 or 0, not 'yes'"),
        (["--m", "8", "--dp-overlap", "2"], "argument --dp-overlap: 1 or 0, not '2'"),
        (["--m", "8", "--inject", "slow:0:1e3"], "not a number written in decimals: '1e3'"),
        (["--m", "8", "--unknown"], "unrecognized arguments: --unknown"),
    ],
)
def test_numbers_are_read_strictly_and_any_refusal_is_one_line(tmp_path, args, words):
    """`yes`, `1e20`, `inf`, `+2` are no counts; argparse's refusal was a usage block of eight lines."""
    traces = tmp_path / "traces"
    result = subprocess.run(
        [sys.executable, "-m", "runners", "trace", "--sched", "gpipe", *args, "--traces", str(traces)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (result.returncode, result.stderr.count("\n")) == (2, 1), result.stderr
    assert result.stderr.startswith("error: ") and words in result.stderr
    assert not traces.exists()


@pytest.mark.parametrize("existing", ["file", "folder"])
def test_run_dir_to_never_replaces_what_is_there(tmp_path, existing):
    """It is for make's /dev/fd/3; `--run-dir-to ~/notes.txt` would have been overwritten after the run."""
    target = tmp_path / "mine"
    target.write_text("mine") if existing == "file" else target.mkdir()
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "runners",
            "trace",
            "--sched",
            "gpipe",
            "--m",
            "2",
            "--run-dir-to",
            str(target),
        ]
        + ["--traces", str(tmp_path / "traces")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert (result.returncode, result.stderr.count("\n")) == (2, 1) and "--run-dir-to" in result.stderr
    assert (target.read_text() == "mine") if existing == "file" else target.is_dir()
    assert not (tmp_path / "traces").exists()


@pytest.mark.parametrize(
    "requested,p,count,device",
    [
        ("auto", 4, 0, "cpu"),
        ("auto", 4, 4, "cuda"),
        ("auto", 2, 8, "cuda"),
        ("cpu", 4, 8, "cpu"),
        ("cuda", 1, 1, "cuda"),
    ],
)
def test_device_choice(requested, p, count, device):
    assert choose_device(requested, p, count) == device


def test_forcing_cpu_never_counts_gpus():
    def count_gpus() -> int:
        raise AssertionError("counted GPUs although the device was forced to cpu")

    assert resolve(RunRequest("gpipe", 4, 8, device="cpu"), count_gpus).backend == "gloo"


def test_default_preset_follows_the_device():
    assert resolve(RunRequest("gpipe", 2, 8), gpus(2)).preset.name == "seed"
    assert resolve(RunRequest("gpipe", 2, 8), no_gpus).preset.name == "cpu"


def test_multi_node_job_needs_a_gpu_per_local_rank_only():
    resolved = resolve(RunRequest("gpipe", 8, 8), gpus(4), ranks_per_node=4)
    assert (resolved.device, resolved.backend, resolved.mode) == ("cuda", "nccl", PROCESSES)
    with pytest.raises(RequestError, match="4 ranks on this node need 4 GPUs"):
        resolve(RunRequest("gpipe", 8, 8), gpus(1), ranks_per_node=4)


@pytest.mark.parametrize("requested", ["auto", "cuda"])
@pytest.mark.parametrize("count", [1, 3])
def test_fewer_gpus_than_ranks_run_the_ranks_as_streams_of_one_gpu(requested, count):
    resolved = resolve(RunRequest("gpipe", 4, 8, device=requested), gpus(count))
    assert (resolved.device, resolved.backend, resolved.mode, resolved.preset.name) == (
        "cuda",
        "nccl",
        SINGLE_GPU,
        "seed",
    )
    line = mode_line(resolved)
    assert "P=4 ranks as CUDA streams of one process on one GPU" in line and "\n" not in line


def test_as_many_gpus_as_ranks_run_one_process_per_rank_and_say_nothing_of_it():
    resolved = resolve(RunRequest("gpipe", 4, 8), gpus(4))
    assert resolved.mode == PROCESSES and mode_line(resolved) is None


def test_dp_pipelines_run_p_x_dp_workers_on_cpu_or_on_a_gpu_each():
    """More ranks than cores is allowed on CPU (the ranks take turns; the analysis flags it)."""
    on_cpu = resolve(RunRequest("1f1b", 2, 4, dp=4, dp_overlap=True), no_gpus)
    command = torchrun_command(on_cpu, Path("run"))
    assert "--nproc_per_node=8" in command and command[command.index("--dp") + 1] == "4"
    assert "--dp-overlap" in command
    on_gpus = resolve(RunRequest("1f1b", 2, 4, dp=2), gpus(4))
    assert (on_gpus.device, on_gpus.mode) == ("cuda", PROCESSES)
    assert "--dp" not in torchrun_command(resolve(RunRequest("1f1b", 2, 4), no_gpus), Path("run"))


def test_a_single_gpu_run_is_one_torchrun_worker_holding_every_rank(tmp_path):
    command = torchrun_command(resolve(RunRequest("1f1b", 4, 8), gpus(1)), tmp_path)
    assert "--nproc_per_node=1" in command
    assert command[command.index("--virtual-ranks") + 1] == "4"
    assert "--virtual-ranks" not in torchrun_command(resolve(RunRequest("1f1b", 4, 8), gpus(4)), tmp_path)


@pytest.mark.parametrize("rows,m", [(512, 1), (512, 8), (512, 32), (64, 7), (10, 10)])
def test_microbatches_cover_the_batch_evenly(rows, m):
    sizes = microbatch_rows(rows, m)
    assert len(sizes) == m and sum(sizes) == rows and max(sizes) - min(sizes) <= 1


def test_every_preset_runs_the_example_requests():
    """SCHED=gpipe/1f1b/zb M=8, interleaved V=2, M=1: all allowed by every preset (P=4)."""
    for preset in PRESETS.values():
        assert all(preset_problem(preset, m, v) is None for m, v in [(8, 1), (8, 2), (1, 1)]), preset.name


@pytest.mark.parametrize("name", sorted(ENGINES))
def test_every_engine_names_a_module_that_builds_its_step(name):
    build_step = ENGINES[name].step_builder()
    assert callable(build_step) and list(inspect.signature(build_step).parameters) == ["setup"]


def test_what_the_launcher_imports_needs_no_torch():
    """A bad request is refused before torch (seconds to import) is loaded."""
    modules = [
        "runners.request",
        "runners.inject",
        "runners.mesh",
        "runners.presets",
        "runners.engines",
        "runners.engines.torch_classes",
        "runners.schedules",
        "runners.launch",
        "runners.results",
        "runners.rundir",
    ]
    code = (
        f"import sys; import {', '.join(modules)}; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'polars', 'msgspec', 'altair'}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "[]"


@pytest.mark.parametrize(
    "args,words",
    [
        (["--sched", "1f1b", "--p", "4", "--m", "2"], "m=2 < p=4"),
        (["--sched", "interleaved", "--p", "2", "--m", "4", "--v", "0"], "v"),
        (["--sched", "nope", "--p", "2", "--m", "4"], "unknown schedule"),
        (["--sched", "gpipe", "--p", "64", "--m", "4", "--device", "cuda"], "GPU"),
    ],
)
def test_cli_refuses_before_any_process_starts(tmp_path, args, words):
    traces = tmp_path / "traces"
    result = subprocess.run(
        [sys.executable, "-m", "runners", "trace", *args, "--traces", str(traces)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and words in result.stderr
    assert not traces.exists()  # no run directory, so no worker was started


def test_sweep_validates_every_m_before_the_first_run(tmp_path):
    traces = tmp_path / "traces"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "runners",
            "sweep",
            "--sched",
            "1f1b",
            "--p",
            "2",
            "--ms",
            "4 1",
            "--traces",
            str(traces),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2 and "m=1 < p=2" in result.stderr
    assert not traces.exists()


@pytest.mark.parametrize(
    "device, gpus, cores, expected",
    [("auto", 0, 2, 2), ("auto", 0, 16, 4), ("cpu", 8, 1, 1), ("auto", 4, 2, 4), ("cuda", 1, 2, 4)],
)
def test_p_defaults_to_one_rank_per_core_on_cpu_and_the_seeds_four_on_cuda(device, gpus, cores, expected):
    asked = []
    assert default_p(device, lambda: asked.append(1) or gpus, cores) == expected
    assert asked == ([] if device == "cpu" else [1])  # --device cpu does not wait for torch to count GPUs
