"""scripts/gpu_check.sh and its result table, checked without a GPU."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from runners.results import busiest_rank_compute_ms, row, table
from runners.rundir import write_run_json
from runners.schedules import build

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
        pytest.skip("this machine may have a GPU")
    env = {**os.environ, "PY": str(REPO / ".venv" / "bin" / "python")}
    result = subprocess.run(
        ["bash", str(SCRIPT), str(tmp_path / "out")], env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and "no CUDA device" in result.stderr and result.stderr.count("\n") == 1
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_script_end_to_end_on_cpu(tmp_path):
    """DEVICE=cpu PRESET=tiny: the same script path as on the GPU machine, traced runs and table included."""
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
    assert "torch " in (out / "environment.txt").read_text()
    body = (out / "results.md").read_text().splitlines()[2:]
    assert [line.split("|")[5].strip() for line in body] == ["1", "2"]  # one row per m, latest not repeated
    runs = [path for path in (out / "traces").iterdir() if not path.is_symlink()]
    assert len(runs) == 2 and all((run / "rank1.json.gz").exists() for run in runs)
