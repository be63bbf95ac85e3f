"""scripts/gpu_check.sh and its result table, checked without a GPU."""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from runners.results import busiest_rank_compute_ms, row, table
from runners.rundir import write_run_json
from runners.schedules import build
from runners.schedules.single_gpu import SINGLE_GPU
from runners.schedules.trace_names import CUDA_PEAK_COUNTER
from runners.seed_table import curve_rows, peak_mib, seed_row, tables

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "gpu_check.sh"


def fake_run(
    directory: Path, p: int, m: int, v: int, calibration: dict, step_ms: float, schedule: str = ""
) -> Path:
    directory.mkdir(parents=True)
    write_run_json(
        directory,
        {
            "schedule": schedule or ("interleaved" if v > 1 else "gpipe"),
            "p": p,
            "m": m,
            "v": v,
            "device": "cuda",
            "host": {"gpu": "NVIDIA H200"},
            "dims": {"microbatch_rows": [8192 // m] * m},
            "calibration": calibration,
            "step_time_unprofiled_ms": step_ms,
            "phases_s": {"a": 1.5, "b": 2.0},
        },
    )
    return directory


def test_script_syntax():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def test_busiest_rank_sums_its_interleaved_stages(tmp_path):
    # p=2, v=2: rank 0 holds stages 0 and 2 (1+2 + 3+4 = 10 ms), rank 1 stages 1 and 3 (1+1 + 1+1 = 4 ms)
    calibration = {
        "0": {"F_ms": 1, "B_ms": 2},
        "1": {"F_ms": 1, "B_ms": 1},
        "2": {"F_ms": 3, "B_ms": 4},
        "3": {"F_ms": 1, "B_ms": 1},
    }
    run = fake_run(tmp_path / "r", 2, 4, 2, calibration, step_ms=20.0)
    assert busiest_rank_compute_ms(calibration, build("interleaved", 2, 4, 2)) == 10
    result = row(run)
    assert result["bubble formula"] == pytest.approx(1 / 9)  # (p-1)/(v*m+p-1) = 1/(8+1)
    assert result["1 - compute/step"] == pytest.approx(0.5)  # 1 - 10/20
    assert result["run s"] == pytest.approx(3.5) and result["device"] == "NVIDIA H200"


def test_busiest_rank_follows_the_v_placement_of_zbv(tmp_path):
    # p=2 in a V: rank 0 holds stages 0 and 3 (3 + 2 = 5 ms), rank 1 stages 1 and 2 (2 + 5 = 7 ms). Placed
    # as a loop (stage s on rank s % 2) rank 0 would hold 0 and 2, 8 ms, and be the busiest.
    calibration = {
        "0": {"F_ms": 1, "B_ms": 2},
        "1": {"F_ms": 1, "B_ms": 1},
        "2": {"F_ms": 2, "B_ms": 3},
        "3": {"F_ms": 1, "B_ms": 1},
    }
    run = fake_run(tmp_path / "zbv", 2, 4, 2, calibration, step_ms=14.0, schedule="zbv")
    result = row(run)
    assert result["full-batch compute ms"] == 7
    assert result["1 - compute/step"] == pytest.approx(0.5)  # 1 - 7/14
    # zbv's own geometry: its order at unit times (F 1, I 1, W 1), not interleaved's (p-1)/(v*m+p-1) = 1/9
    assert result["bubble formula"] == pytest.approx(1 / 25)


def test_table_has_one_line_per_run(tmp_path):
    calibration = {"0": {"F_ms": 5, "B_ms": 10}}
    rows = [row(fake_run(tmp_path / f"m{m}", 1, m, 1, calibration, 15.0 + m)) for m in (1, 2)]
    lines = table(rows).splitlines()
    assert len(lines) == 4 and lines[2].split("|")[5].strip() == "1" and lines[3].split("|")[5].strip() == "2"


def test_without_a_gpu_the_script_refuses_in_one_line(tmp_path):
    if shutil.which("nvidia-smi"):
        pytest.skip("nvidia-smi is installed: this machine may have an NVIDIA GPU, and the test needs none")
    env = {**os.environ, "PY": str(REPO / ".venv" / "bin" / "python")}
    result = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and "no CUDA device" in result.stderr and result.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()


def seed_run(directory: Path, p: int, m: int, step_ms: float, mode: str = SINGLE_GPU) -> Path:
    """A run.json as the worker writes it for the seed on one GPU: 8192 rows, stage s's microbatch of r
    rows taking (s + 1) * r / 8192 ms forward and twice that backward."""
    directory.mkdir(parents=True)
    sizes = [8192 // count for count in (1, 2, 4, 8, 16, 32)]
    by_rows = {
        str(s): {str(r): {"F_ms": (s + 1) * r / 8192, "B_ms": 2 * (s + 1) * r / 8192} for r in sizes}
        for s in range(p)
    }
    write_run_json(
        directory,
        {
            "schedule": "gpipe",
            "p": p,
            "m": m,
            "v": 1,
            "mode": mode,
            "dims": {"rows": 8192, "microbatch_rows": [8192 // m] * m},
            "calibration_by_rows": by_rows,
            "step_time_unprofiled_ms": step_ms,
        },
    )
    return directory


def table_rows(markdown: str) -> list[str]:
    """The body rows of the one markdown table in `markdown`."""
    return [line for line in markdown.splitlines() if line.startswith("|")][2:]


def test_the_seed_row_is_the_seeds_own_arithmetic(tmp_path):
    # p=4 m=8: the busiest stage is stage 3, t_slot = 4 * 1024/8192 * 3 = 1.5 ms, m * t_slot = 12 ms
    row = seed_row(seed_run(tmp_path / "run", 4, 8, step_ms=20.0))
    assert row["t_slot ms"] == pytest.approx(1.5) and row["m*t_slot ms"] == pytest.approx(12.0)
    assert row["bubble theory"] == pytest.approx(3 / 11) and row["bubble measured"] == pytest.approx(
        1 - 12 / 20
    )
    assert row["mode"] == SINGLE_GPU and row["peak MiB"] is None  # no trace, no allocator peak


def test_the_allocator_peak_is_the_largest_of_the_traces_counters(tmp_path):
    run = seed_run(tmp_path / "run", 2, 2, step_ms=5.0)
    counters = [
        {"ph": "C", "name": CUDA_PEAK_COUNTER, "ts": t, "args": {"peak_bytes_above_step_start": mib * 2**20}}
        for t, mib in ((1, 300), (2, 512), (3, 100))
    ]
    (run / "rank0.json.gz").write_bytes(gzip.compress(json.dumps({"traceEvents": counters}).encode()))
    assert peak_mib(run) == 512


def test_the_small_gemm_curve_lists_t_slot_at_every_microbatch_size(tmp_path):
    rows = curve_rows(seed_run(tmp_path / "p1", 1, 1, step_ms=3.0))
    assert [row["m"] for row in rows] == [1, 2, 4, 8, 16, 32]
    assert all(row["m*t_slot ms"] == pytest.approx(3.0) for row in rows)  # this fake GEMM has no loss
    assert rows[-1]["rows/mb"] == 256 and rows[-1]["t_slot ms"] == pytest.approx(3 / 32)


def test_the_tables_put_pipelined_runs_in_the_seed_table_and_p1_runs_in_the_curve(tmp_path):
    runs = [seed_run(tmp_path / f"m{m}", 4, m, step_ms=10.0 + m) for m in (2, 1)] + [
        seed_run(tmp_path / "p1", 1, 1, 3.0)
    ]
    text = tables(runs)
    seed, curve = text.split("## small-GEMM curve")
    assert [line.split("|")[2].strip() for line in table_rows(seed)] == ["1", "2"]  # sorted by m
    assert "(P=1, p1)" in curve and len(table_rows(curve)) == 6


@pytest.mark.slow
def test_script_end_to_end_on_cpu(tmp_path):
    """DEVICE=cpu PRESET=tiny: the same script path as on the GPU machine, traced runs, tables and
    tarball included (P ranks as processes: the single_gpu mode needs CUDA)."""
    out = tmp_path / "out"
    env = {
        **os.environ,
        "PY": str(REPO / ".venv" / "bin" / "python"),
        "DEVICE": "cpu",
        "PRESET": "tiny",
        "MS": "1 2",
        "P": "2",
        "STEPS": "1",
    }
    result = subprocess.run(
        ["bash", str(SCRIPT), str(out)], env=env, capture_output=True, text=True, timeout=400
    )
    assert result.returncode == 0, result.stdout + result.stderr
    results = (out / "results.md").read_text()
    assert "torch " in results and "torch " in (out / "environment.txt").read_text()
    seed, curve = results.split("## seed table")[1].split("## small-GEMM curve")
    assert [line.split("|")[2].strip() for line in table_rows(seed)] == ["1", "2"]  # one row per m
    assert len(table_rows(curve)) == 6  # t_slot at the microbatch sizes of m = 1 ... 32
    with tarfile.open(out / "traces.tar.gz") as packed:
        names = packed.getnames()
    runs = {Path(name).parts[1] for name in names if name.endswith("run.json")}
    assert (
        len(runs) == 3 and sum(name.endswith(".json.gz") and "/rank" in name for name in names) == 2 + 2 + 1
    )
