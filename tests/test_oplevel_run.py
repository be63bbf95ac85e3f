"""An op-level run (tests/data/stragglers: ByteDance StragglerAnalysis's job ST, PP4 x DP2, m=4) analysed
as the GPU traces it converts to."""

from __future__ import annotations

import re
import shutil

import msgspec
import polars as pl
import pytest
from conftest import DATA, summary_of

from analysis.cli import main
from analysis.report import whatif_section
from analysis.schema import Summary
from analysis.traces.oplevel import read_timeline
from analysis.traces.oplevel_kineto import LIMITS

ST = DATA / "stragglers"


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    run = tmp_path_factory.mktemp("oplevel") / "ST"
    shutil.copytree(ST, run)
    assert main(["analyze", str(run)]) == 0
    return run, msgspec.json.decode((run / "analysis" / "summary.json").read_bytes())


def test_the_job_is_read_with_its_shape_and_steps(analysed):
    run, summary = analysed
    assert (summary["p"], summary["m"], summary["dp"], summary["steps_analyzed"]) == (4, 4, 2, 32)
    assert sorted(path.name for path in run.glob("rank*.json.gz")) == [f"rank{r}.json.gz" for r in range(8)]
    assert [pipeline["ranks"] for pipeline in summary["pipelines"]] == [[0, 2, 4, 6], [1, 3, 5, 7]]


def test_steps_keep_their_recorded_times(analysed):
    """The job's step is its median step's recorded span (its last op's end less its first op's start)
    within 0.5 ms: a rank's window runs from its first action to the next step's, so the ops before the
    first action (params-all-gather) move it by the difference of their lengths (measured 0.11 ms)."""
    _, summary = analysed
    ops = read_timeline(ST).ops.filter(pl.col("step") == summary["median_step"])
    recorded = (ops["end_ts"].max() - ops["start_ts"].min()) * 1e3
    assert summary["step_time_ms"] == pytest.approx(recorded, abs=0.5)


def test_the_slow_last_stage_is_named_and_no_replica_straggles(analysed):
    _, summary = analysed
    busy = {entry["rank"]: entry["busy_ms"] for entry in summary["ranks"]}
    last = [busy[6], busy[7]]
    assert min(last) > 1.5 * max(busy[r] for r in range(6))  # measured 1.62x
    assert summary["straggler"]["slower_fraction"] < 0.05
    assert all(entry["launch_overhead_ms"] == 0 for entry in summary["ranks"])  # no host time recorded


def test_virtual_stages_are_refused_in_one_line(tmp_path, capsys):
    run = tmp_path / "vpp"
    shutil.copytree(ST, run)
    meta = (run / "meta-ST.yaml").read_text().replace("vpp_size: 1", "vpp_size: 2")
    (run / "meta-ST.yaml").write_text(meta)
    assert main(["analyze", str(run)]) == 2
    err = capsys.readouterr().err
    assert "trace-ST.parquet: virtual pipeline stages (vpp_size > 1)" in err and err.count("\n") == 1


def test_the_summary_carries_the_whatif_figures(analysed):
    run, summary = analysed
    assert main(["whatif", str(run)]) == 0
    assert summary["whatif"] == msgspec.json.decode((run / "whatif.json").read_bytes())
    assert max(summary["whatif"]["by_stage"], key=summary["whatif"]["by_stage"].get) == "3"
    assert LIMITS in summary["notes"]  # what an op-level run cannot measure, said where it is shown


def test_the_run_page_shows_the_whatif_figures(analysed):
    _, summary = analysed
    shown = whatif_section.section_html(msgspec.convert(summary, Summary))
    value = f"{summary['whatif']['by_stage']['3']:.3f}"
    assert re.search(f"S_stage 3</td><td[^>]*>{re.escape(value)}</td>", shown)
    assert whatif_section.section_html(summary_of()) == ""  # a profiled run has none


def test_every_tensor_parallel_rank_recorded_is_read_as_one_lane(tmp_path, analysed):
    """Both ranks of each tensor-parallel pair recorded (the partner's durations doubled): the lowest
    rank of each (stage, dp_rank) stands for the pair, so the job analyses as the one-rank recording."""
    _, summary = analysed
    run = tmp_path / "tp2"
    run.mkdir()
    ops = pl.read_parquet(ST / "trace-ST.parquet")
    partner = ops.with_columns(pl.col("rank") + 8, pl.col("duration") * 2)
    pl.concat([ops, partner]).write_parquet(run / "trace-ST.parquet")
    meta = (ST / "meta-ST.yaml").read_text().replace("tp_size: 1", "tp_size: 2")
    (run / "meta-ST.yaml").write_text(meta.replace("world_size: 8", "world_size: 16"))
    assert main(["analyze", str(run)]) == 0
    both = msgspec.json.decode((run / "analysis" / "summary.json").read_bytes())
    assert (both["p"], both["dp"], both["step_time_ms"]) == (4, 2, summary["step_time_ms"])
