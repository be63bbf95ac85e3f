"""What-if figures of ByteDance StragglerAnalysis's job ST (tests/data/stragglers) against their published
results, the op-graph replay's completeness, and the op-level reader's refusals."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgspec
import numpy as np
import polars as pl
import pytest
from conftest import DATA

from analysis.cli import main
from analysis.traces.oplevel import read_timeline
from analysis.traces.run_files import RUN_FILES, WHATIF_FILE, is_run_directory
from analysis.whatif.figures import whatif
from analysis.whatif.replay import measure, replay

ST = DATA / "stragglers"
S_RELATIVE = 0.05  # the tolerance on S and each S_stage, relative
SHARE_ABSOLUTE = 0.05  # and on M_S and M_W, absolute
# Our replay against theirs: their mean replayed step (launch delays removed) and their ideal one,
# relative. Measured: 4e-9 and 8e-8 (float32 inputs). The median of transfers as typical (rather than the
# mean) moves the ideal step by 1.3%, collectives that do not wait for every replica by 0.3%, p2p ops
# after the last compute ended before them (rather than their direction's) the replayed step by 0.1%.
REPLAY_RELATIVE = 1e-5


def published(name: str) -> dict:
    return json.loads((ST / f"{name}-ST.json").read_text())


@pytest.fixture(scope="module")
def measured():
    return measure(read_timeline(ST).lanes(), ST / "trace-ST.parquet")


@pytest.fixture(scope="module")
def figures(measured):
    return whatif(measured)


def test_slowdown_matches_the_published_one(figures):
    result = published("result")
    assert figures.S == pytest.approx(result["blocking_slowdown"], rel=S_RELATIVE)
    for stage, value in result["blocking_decompose_by_stage"].items():
        assert figures.by_stage[stage] == pytest.approx(value, rel=S_RELATIVE)
    assert max(figures.by_stage, key=figures.by_stage.get) == "3"  # the slow last stage, as published
    assert set(figures.by_optype) == set(result["blocking_decompose_by_optype"])


def test_shares_match_the_published_ones(figures):
    assert figures.M_S == pytest.approx(published("ms")["Ms"], abs=SHARE_ABSOLUTE)
    assert figures.M_W == pytest.approx(published("mw")["Mw"], abs=SHARE_ABSOLUTE)


def test_replay_model_matches_theirs(figures):
    shares = published("ms")
    assert figures.replay_ms == pytest.approx(shares["tori"] * 1e3, rel=REPLAY_RELATIVE)
    assert figures.ideal_ms == pytest.approx(shares["tideal"] * 1e3, rel=REPLAY_RELATIVE)


def test_replay_with_launch_delays_is_the_recorded_step(measured):
    """The replay engine, given each op's launch delay (its start less the end of what it waits for),
    gives back each step's recorded span (within the float32 timestamps' rounding, 0.1 ms at 2 s)."""
    np.testing.assert_allclose(
        replay(measured.graph, measured.time, measured.delay), measured.step_s, atol=1e-4
    )


def test_whatif_command_writes_its_file(tmp_path, capsys):
    run = tmp_path / "ST"
    shutil.copytree(ST, run)
    assert is_run_directory(run) and WHATIF_FILE in RUN_FILES
    assert main(["whatif", str(run)]) == 0
    written = msgspec.json.decode((run / WHATIF_FILE).read_bytes())
    assert {"S", "by_stage", "by_dp_rank", "by_optype", "M_S", "M_W"} <= set(written)
    assert "worst stage 3" in capsys.readouterr().out


def _run_with(tmp_path: Path, ops: pl.DataFrame | None = None, meta: str | None = None) -> Path:
    run = tmp_path / "bad"
    run.mkdir()
    (ops if ops is not None else pl.read_parquet(ST / "trace-ST.parquet")).write_parquet(
        run / "trace-X.parquet"
    )
    (run / "meta-X.yaml").write_text(meta if meta is not None else (ST / "meta-ST.yaml").read_text())
    return run


@pytest.mark.parametrize(
    ("ops", "meta", "problem"),
    [
        (None, "dp_size: [", "meta-X.yaml: not a readable yaml file"),
        (
            None,
            "dp_size: 2\npp_size: 4\nworld_size: 9\n",
            "meta-X.yaml: world_size 9 is not dp x pp x tp x dsp = 8",
        ),
        (None, "dp_size: 0\n", "meta-X.yaml: dp_size is 0, not a positive integer"),
        (pl.DataFrame({"step": [1]}), None, "trace-X.parquet: lacks the column(s) dp_rank"),
        (
            pl.read_parquet(ST / "trace-ST.parquet").filter(
                ~((pl.col("step") == 25) & (pl.col("seq_id") == 3))
            ),
            None,
            "trace-X.parquet: its steps and replicas do not all run the same ops",
        ),
    ],
)
def test_malformed_run_is_one_line(tmp_path, capsys, ops, meta, problem):
    assert main(["whatif", str(_run_with(tmp_path, ops, meta))]) == 2
    err = capsys.readouterr().err
    assert problem in err and err.count("\n") == 1 and "Traceback" not in err


def test_unreadable_parquet_is_one_line(tmp_path, capsys):
    run = _run_with(tmp_path)
    (run / "trace-X.parquet").write_bytes(b"PAR1 not really")
    assert main(["whatif", str(run)]) == 2
    assert "trace-X.parquet: not a readable parquet file" in capsys.readouterr().err


def test_every_tensor_parallel_rank_recorded_gives_the_same_figures(tmp_path, figures):
    """A job that records both ranks of each tensor-parallel pair (the second one slowed, as if the
    recorder's clock were off) is read through the lowest rank of each (stage, dp_rank)."""
    ops = pl.read_parquet(ST / "trace-ST.parquet")
    partner = ops.with_columns(pl.col("rank") + 8, pl.col("duration") * 2)
    meta = (
        (ST / "meta-ST.yaml")
        .read_text()
        .replace("tp_size: 1", "tp_size: 2")
        .replace("world_size: 8", "world_size: 16")
    )
    run = _run_with(tmp_path, pl.concat([ops, partner]), meta)
    both = whatif(measure(read_timeline(run).lanes(), run / "trace-X.parquet"))
    assert both == figures
