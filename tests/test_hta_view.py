"""`python -m analysis hta`: Holistic Trace Analysis's figures beside ours. On a synthetic GPU pipeline
both sides apply and the totals that should agree do; on real GPU traces nobody here wrote HTA's figures
stand whether our analysis reads the traces (DLRM, 8 ranks, read as gpipe m=1) or refuses them (AlexNet,
one rank); missing HTA, a CPU run and HTA's own failure are one line and exit 2; the run page shows the
figures or says how to get them. HTA is slow to import and parse: each trace set is viewed once."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from conftest import REAL_TRACES

from analysis.cli import main
from analysis.hta import compare as hta_compare
from analysis.hta import figures as hta_figures
from analysis.job.run_dir import analysis_of
from analysis.report import hta_section
from analysis.report.runs import load_run
from runners.schedules import build
from synthetic import write_run

# gpipe p=2 m=8: 32 launches a rank a step. HTA 0.5 under pandas 3 fails (a TypeError) on a trace whose
# correlation ids all fit in an int8, so at least 128 launches a rank; labels=False since the synthetic
# gpu_user_annotation carries a stream, which HTA takes for a kernel's (real Kineto ones carry none).
STEPS = 5
PIPELINE = {"shape": "gpu", "steps": STEPS, "labels": False, "launch_gap_us": 50, "p2p_latency_us": 100}
NS = 1e-6  # one nanosecond in ms: ours are whole ns, HTA's floats


@dataclass(frozen=True)
class Viewed:
    path: Path
    code: int
    out: str
    err: str


def command(name: str, run_dir: Path) -> Viewed:
    """`python -m analysis NAME RUN` in this process: HTA, once imported, stays imported."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([name, str(run_dir)])
    return Viewed(run_dir, code, out.getvalue(), err.getvalue())


def hta_command(run_dir: Path) -> Viewed:
    return command("hta", run_dir)


def pipeline_run(directory: Path) -> None:
    write_run(directory, build("gpipe", 2, 8), **PIPELINE)
    # a trace HTA would parse as one more rank if it read the folder rather than the loader's rank traces
    shutil.copy(directory / "rank1.json.gz", directory / "merged.json.gz")


def copied(folder: str):
    return lambda directory: shutil.copytree(REAL_TRACES / folder, directory, dirs_exist_ok=True)


SOURCES = {
    "pipeline": pipeline_run,
    "dlrm": copied("param_dlrm_8rank"),
    "alexnet": copied("hta/critical_path/alexnet"),
    "cpu": lambda directory: write_run(directory, build("gpipe", 2, 4), steps=3),
}


@pytest.fixture(scope="module")
def view(tmp_path_factory):
    """Each source written or copied into a folder of its own (the command writes there) and viewed once."""
    pytest.importorskip(
        "hta.trace_analysis",
        reason="Holistic Trace Analysis (package hta, the [hta] extra: pip install -e '.[hta]') is not installed",
    )
    done: dict[str, Viewed] = {}

    def viewed(name: str) -> Viewed:
        if name not in done:
            directory = tmp_path_factory.mktemp(name)
            SOURCES[name](directory)
            done[name] = hta_command(directory)
        return done[name]

    return viewed


def test_pipeline_totals_agree_and_host_wait_differs_by_the_rule(view):
    viewed = view("pipeline")
    assert viewed.code == 0, viewed.err
    figures = hta_figures.read(viewed.path)
    ours = hta_compare.ours_beside(analysis_of(viewed.path))
    truth = {t["rank"]: t for t in json.loads((viewed.path / "truth.json").read_text())}
    assert [rank.rank for rank in figures.ranks] == [0, 1] and figures.ranks_without_kernels == []
    for rank in figures.ranks:
        # HTA rounds each kernel to whole microseconds: the synthetic's times are whole microseconds, so
        # nothing moves, and both sides must agree to our resolution
        assert rank.rounding_ms == 0
        mine = ours[rank.rank]
        assert rank.compute_ms == pytest.approx(mine.busy_ms, abs=NS)
        assert rank.compute_ms == pytest.approx(STEPS * truth[rank.rank]["compute_ns"] / 1e6, abs=NS)
        assert rank.compute_stream_idle.total_ms == pytest.approx(mine.idle_total_ms, abs=NS)
        assert rank.idle_ms + rank.compute_ms + rank.non_compute_ms == pytest.approx(rank.span_ms)
        # the synthetic host launches each kernel once the one before has run, so HTA calls every gap host
        # wait; ours is the launch gaps alone (50 us before each compute action but a rank's first)
        assert rank.compute_stream_idle.host_wait_ms == pytest.approx(mine.idle_total_ms, abs=NS)
        assert 0 < mine.idle_ms["launch_overhead"] < rank.compute_stream_idle.host_wait_ms
        assert [k.name for k in rank.top_kernels][0] == "ampere_sgemm_128x64_tn"
    assert (
        "Agree on every rank, within what HTA's rounding of kernel times to whole microseconds can move "
        "(at most 0.000 ms a rank): compute (HTA) vs busy (ours), idle on the compute stream. "
        "Differ: host_wait (HTA) vs launch_overhead (ours) on 2 of 2 ranks"
    ) in viewed.out
    assert f"written: {viewed.path / 'hta.json'}" in viewed.out


def test_hta_json_is_no_rank_trace_to_the_loader(view):
    analyzed = command("analyze", view("pipeline").path)
    assert analyzed.code == 0 and "hta.json" not in analyzed.err


def test_dlrm_gets_htas_figures_and_ours_say_it_is_not_a_pipeline(view):
    """HTA's figures for the 8 DLRM ranks; ours refuse the job as not a pipeline (the trust gate), so
    nothing is compared."""
    viewed = view("dlrm")
    assert viewed.code == 0, viewed.err
    figures = hta_figures.read(viewed.path)
    assert [rank.rank for rank in figures.ranks] == list(range(8))
    for rank in figures.ranks:
        assert rank.rounding_ms == 0  # whole-microsecond times
        assert rank.compute_stream == 7 and 0 < rank.overlap_pct < 100
        assert rank.idle_ms + rank.compute_ms + rank.non_compute_ms == pytest.approx(rank.span_ms)
        assert len(rank.top_kernels) == hta_figures.TOP_KERNELS
        assert rank.top_kernels[0].kernel_type == "COMMUNICATION"
    assert "ours: unavailable: " in viewed.out and "not a pipeline-parallel job" in viewed.out
    assert "Agree" not in viewed.out and "Differ" not in viewed.out


def test_traces_ours_refuses_still_get_htas_figures(view):
    viewed = view("alexnet")
    assert viewed.code == 0, viewed.err
    figures = hta_figures.read(viewed.path)
    assert [rank.rank for rank in figures.ranks] == [0] and figures.ranks[0].overlap_pct is None  # no NCCL
    assert "ours: unavailable: " in viewed.out and "not a pipeline-parallel job: one rank" in viewed.out
    assert "Agree" not in viewed.out and "Differ" not in viewed.out


def one_line_refusal(viewed: Viewed) -> str:
    assert viewed.code == 2 and viewed.out == ""
    assert not (viewed.path / "hta.json").exists()
    lines = viewed.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    return lines[0]


def test_without_hta_one_line_naming_the_extra(tmp_path, monkeypatch):
    write_run(tmp_path, build("gpipe", 2, 4), shape="gpu", steps=3)
    monkeypatch.setitem(sys.modules, "hta", None)  # an import of hta or hta.* now fails as if absent
    monkeypatch.setitem(sys.modules, "hta.trace_analysis", None)
    assert one_line_refusal(hta_command(tmp_path)) == (
        "error: python -m analysis hta needs Holistic Trace Analysis: pip install -e '.[hta]'"
    )


def test_cpu_run_is_refused_in_one_line(view):
    line = one_line_refusal(view("cpu"))
    assert "no GPU kernels in the rank traces (a CPU run)" in line and "do not apply" in line


def test_htas_own_failure_is_one_line(tmp_path, monkeypatch, view):
    import hta.trace_analysis

    def failing(**_):
        raise TypeError("Invalid value '[  9  15\n 21]' for dtype 'int8'")

    monkeypatch.setattr(hta.trace_analysis, "TraceAnalysis", failing)
    pipeline_run(tmp_path)
    line = one_line_refusal(hta_command(tmp_path))
    assert "failed on the traces: TypeError: Invalid value '[  9  15" in line


def test_run_page_section_shows_the_figures_or_how_to_get_them(view, tmp_path):
    shown = hta_section.section_html(load_run(view("pipeline").path))
    assert "HTA host_wait (ms)" in shown and "ours launch_overhead (ms)" in shown
    assert "Agree on every rank" in shown and "ampere_sgemm_128x64_tn" in shown
    write_run(tmp_path / "gpu", build("gpipe", 2, 4), shape="gpu", steps=3)
    assert f"make hta RUN={tmp_path / 'gpu'}" in hta_section.section_html(load_run(tmp_path / "gpu"))
    write_run(tmp_path / "cpu", build("gpipe", 2, 4), steps=3)
    assert "this run ran on CPU" in hta_section.section_html(load_run(tmp_path / "cpu"))
    (tmp_path / "gpu" / "hta.json").write_text("{")
    assert "hta.json: not readable" in hta_section.section_html(load_run(tmp_path / "gpu"))


def test_only_the_hta_command_imports_hta():
    modules = (
        "analysis.cli.analyze, analysis.cli.hta, analysis.hta.run, analysis.hta.compare, analysis.report"
    )
    code = f"import sys; import {modules}; print(sorted(m for m in sys.modules if m.split('.')[0] == 'hta'))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
