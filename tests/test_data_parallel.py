"""PP x DP on the old generator (synthetic.data_parallel), where it only has to write a valid job: the
traces read as streams, the merged trace's order, the report, the refusals, a rank without collectives
and a summary from before PP x DP. What the analysis recovers of a job (the pipelines, the straggler and
each pipeline's step alone, every rank's parts, dp_sync and dp_skew, an all-reduce across stages) is
graded against the independent generator's truth in tests/test_independent_dp.py."""

from __future__ import annotations

import gzip
import json

import polars as pl
import pytest

from analysis import results
from analysis.cli import main
from analysis.job.join import analyze_job
from analysis.job.run_dir import analyze_dir, read_run
from analysis.report import build_report
from analysis.timeline.dp_sync import cut
from analysis.traces import load
from runners.schedules import build
from synthetic.data_parallel import write_job
from synthetic.generate import write_run

SLOW, FACTOR, SYNC_US = 1, 1.5, 300


def job(directory, shape: str, run_json: bool = True, **options):
    written = write_job(
        directory,
        build("1f1b", 2, 4),
        2,
        run_json=run_json,
        **options,
        slow_pipeline=SLOW,
        slow_factor=FACTOR,
        sync_us=SYNC_US,
        shape=shape,
        durations_us={"F": 1000, "B": 2000},
        p2p_latency_us=50,
        launch_gap_us=10,
    )
    return written, analyze_job(read_run(directory)).summary


@pytest.mark.parametrize("run_json", [True, False], ids=["run-json", "p2p-peers"])
def test_a_job_of_several_pipelines_is_read_without_any_trace_text_held_whole(
    tmp_path, monkeypatch, run_json
):
    """The collectives' groups and the p2p peers come from the record_param_comms args kept as the events
    are decoded, so every rank is read as a stream, its text never whole."""

    def whole(path, *_):
        raise AssertionError(f"{path} read whole")

    monkeypatch.setattr(load, "read_text", whole)
    options = {} if run_json else {"labels": False, "process_groups": False}
    written, summary = job(tmp_path, "gpu", run_json=run_json, **options)
    assert [p.ranks for p in summary.pipelines] == written.pipelines
    assert summary.straggler.pipeline == SLOW


def test_one_pipeline_has_no_dp_sync(tmp_path):
    write_run(tmp_path, build("1f1b", 2, 4))
    one = analyze_job(read_run(tmp_path)).summary
    assert one.dp == 1 and one.straggler is None and [p.ranks for p in one.pipelines] == [[0, 1]]
    assert all(entry.dp_sync_ms == 0 and entry.dp_skew_ms == 0 for entry in one.ranks)


def test_gaps_are_cut_at_the_union_of_the_intervals():
    gaps = pl.DataFrame(
        {"rank": [0, 0], "step": [0, 0], "start_ns": [0, 100], "end_ns": [50, 200], "class": ["a", "b"]}
    )
    intervals = pl.DataFrame({"rank": [0, 0, 1], "start_ns": [40, 120, 0], "end_ns": [130, 150, 500]})
    pieces = cut(gaps, intervals)
    assert pieces.select("start_ns", "end_ns", "class", "inside").rows() == [
        (0, 40, "a", False),
        (40, 50, "a", True),
        (100, 150, "b", True),
        (150, 200, "b", False),
    ]


def test_the_merged_trace_shows_ranks_by_pipeline_then_stage_and_arrows_within_pipelines(tmp_path):
    job(tmp_path, "cpu")
    assert main(["merge", str(tmp_path)]) == 0
    events = json.loads(gzip.decompress((tmp_path / "merged.json.gz").read_bytes()))["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    index = {e["pid"]: e["args"]["sort_index"] for e in events if e.get("name") == "process_sort_index"}
    order = sorted(names, key=index.get)
    assert [names[pid] for pid in order] == [
        "pipeline 0 · rank 0 · stage 0",
        "pipeline 0 · rank 2 · stage 1",
        "pipeline 1 · rank 1 · stage 0",
        "pipeline 1 · rank 3 · stage 1",
    ]
    ends = {}
    for event in events:
        if event.get("ph") in ("s", "f"):
            ends.setdefault(event["id"], set()).add(event["pid"] % 2)  # rank % 2 is the pipeline
    assert ends and all(len(pipelines) == 1 for pipelines in ends.values())


def test_the_report_shows_the_job_and_each_pipeline(tmp_path):
    job(tmp_path / "traces" / "job", "gpu")
    analyze_dir(tmp_path / "traces" / "job")
    index = build_report(tmp_path / "traces", tmp_path / "reports").read_text()
    assert (
        index.index("runs/job.html")
        < index.index("pipeline 0: ranks 0, 2, alone")
        < index.index("pipeline 1: ranks 1, 3, alone")
        < index.index("(straggler, +")
    )
    charts = (tmp_path / "reports" / "runs" / "job.charts.js").read_text()
    first, second = charts.index("measured, pipeline 0 (ranks 0, 2)"), charts.index("measured, pipeline 1")
    assert first < second < charts.index("ideal timeline, pipeline 1")


def edited_run_json(directory, **changes) -> None:
    path = directory / "run.json"
    config = json.loads(path.read_text()) | changes
    path.write_text(json.dumps({k: v for k, v in config.items() if v is not None}))


@pytest.mark.parametrize(
    ("changes", "problem"),
    [
        ({"dp": 3}, "run.json: says p=2, dp=3 but the directory has 4 rank traces"),
        ({"pipelines": [[0, 1, 2, 3]]}, "run.json: says dp=2 but lists 1 pipelines"),
        ({"pipelines": [[0, 2], [1, 2]]}, "run.json: its pipelines do not hold each of the 4 traced ranks"),
        ({"pipelines": None}, "says dp=2 but not which ranks form each pipeline"),
    ],
    ids=["ranks", "dp-vs-pipelines", "pipelines-vs-ranks", "no-pipelines"],
)
def test_a_job_that_does_not_say_its_pipelines_consistently_is_refused_in_one_line(
    tmp_path, capsys, changes, problem
):
    write_job(tmp_path, build("1f1b", 2, 4), 2, process_groups=False)
    edited_run_json(tmp_path, **changes)
    assert main(["analyze", str(tmp_path)]) == 2
    error = capsys.readouterr().err.strip()
    assert problem in error and len(error.splitlines()) == 1


def test_a_rank_without_dp_collectives_is_noted_and_has_no_dp_sync(tmp_path):
    write_job(tmp_path, build("1f1b", 2, 4), 2, sync_us=SYNC_US)
    path = tmp_path / "rank1.json.gz"
    document = json.loads(gzip.decompress(path.read_bytes()))
    collective = {"c10d::allreduce_", "gloo:all_reduce"}
    document["traceEvents"] = [e for e in document["traceEvents"] if e.get("name") not in collective]
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    summary = analyze_job(read_run(tmp_path)).summary
    assert summary.rank_entry(1).dp_sync_ms == 0 and summary.rank_entry(0).dp_sync_ms > 0
    assert any(note.startswith("rank(s) 1: no data-parallel collective found") for note in summary.notes)


def test_a_summary_written_before_pp_x_dp_reads_with_one_pipelines_defaults(tmp_path):
    write_run(tmp_path, build("1f1b", 2, 4))
    analyze_dir(tmp_path)
    path = tmp_path / "analysis" / "summary.json"
    old = json.loads(path.read_text())
    for key in ("dp", "pipelines", "straggler"):
        del old[key]
    for entry in old["ranks"]:
        for key in ("pipeline", "dp_sync_ms", "dp_skew_ms"):
            del entry[key]
    path.write_text(json.dumps(old))
    summary = results.read(tmp_path).summary
    assert summary.dp == 1 and summary.pipelines == [] and summary.straggler is None
    assert all(e.pipeline == 0 and e.dp_sync_ms == 0 and e.dp_skew_ms == 0 for e in summary.ranks)
