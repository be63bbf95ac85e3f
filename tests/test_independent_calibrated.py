"""Small-GEMM loss, slowdown and clock offsets on the independent generator (synthetic.executor_trace):
every schedule, CPU- (gloo, rendezvous) and GPU-shaped (NCCL, eager), each compute action at its
reference time x 1.1 (alone at its microbatch size, the calibration's by-rows entry) x 1.25 (inside the
pipeline), and every rank's clock 3 ms x rank off the true one, alternately ahead and behind.

The analysis must find the offsets and then split each rank's step as the truth does: compute at the
reference, small_gemm, slowdown, the waits, launch_overhead and the optimizer's `other`, to the ns.
Two known departures, pinned so that a change shows:
- on GPU a compute stream queued behind the rank's own SEND is bubble in the analysis, p2p_wait in the
  truth once the awaited data left (p2p_queued_ns; tests/test_independent_gpu.py); every one of
  executor_gpu's DEPARTURES is moved back, so one a later case adds (p2p_unposted_ns: batched) is too;
- clock offsets come from causality (analysis.timeline.clock: the midpoint of each transfer's bracket),
  exact only where the brackets are symmetric: zbv on CPU puts rank 2 3 us off (inside its 83 us
  uncertainty), which moves up to 9 us between its ranks' parts. The truth is the injected offset.
"""

from __future__ import annotations

import json

import pytest

from analysis.job.measure import analyze_pipeline
from analysis.job.run_dir import read_run
from runners.schedules import build
from synthetic.executor_gpu import parts_as_analysed
from synthetic.executor_sim import EAGER, RENDEZVOUS, HostTime, Transport
from synthetic.executor_trace import write_executor_run

US = 1_000
SMALL_GEMM, SLOWDOWN = 1.1, 1.25
HOST = HostTime(before_ns=3 * US, inside_ns=2 * US, tail_ns=300 * US)
TRANSPORT = {"cpu": Transport(RENDEZVOUS, 40 * US), "gpu": Transport(EAGER, 50 * US)}
PARTS = ("compute", "small_gemm", "slowdown", "launch_overhead", "bubble", "p2p_wait", "other")
CASES = {
    "gpipe": ("gpipe", 4, 8, 1),
    "1f1b": ("1f1b", 4, 8, 1),
    "interleaved": ("interleaved", 2, 4, 2),
    "zb": ("zb", 3, 6, 1),
    "zbv": ("zbv", 3, 6, 2),
    "dualpipev": ("dualpipev", 2, 4, 2),
}
CLOCK_ERRORS_NS = {("cpu", "zbv"): {2: 3 * US}}  # the departure: rank -> the estimate's error
MOVED_PER_CLOCK_ERROR = 3  # what a rank's parts may move by, per ns of the largest offset error


def _skew(p: int) -> dict[int, int]:
    return {r: (-1) ** r * 3_000_000 * r for r in range(p)}


@pytest.mark.parametrize("shape", ["cpu", "gpu"])
@pytest.mark.parametrize("name", CASES)
def test_small_gemm_slowdown_and_clock_offsets_are_recovered_per_rank(tmp_path, name, shape):
    schedule, skew = build(*CASES[name]), _skew(CASES[name][1])
    write_executor_run(
        tmp_path,
        schedule,
        transport=TRANSPORT[shape],
        host=HOST,
        shape=shape,
        small_gemm=SMALL_GEMM,
        slowdown=SLOWDOWN,
        clock_offset_ns=skew,
    )
    step = json.loads((tmp_path / "truth.json").read_text())["steps"][0]
    summary = analyze_pipeline(read_run(tmp_path)).summary
    errors = CLOCK_ERRORS_NS.get((shape, name), {})
    # the analysis adds its offset to a rank's times: the injected one, negated, within the departure
    assert {c.rank: c.offset_ns + skew[c.rank] for c in summary.clock.ranks} == {
        r: errors.get(r, 0) for r in skew
    }
    assert all(abs(error) <= summary.clock.ranks[r].uncertainty_ns for r, error in errors.items())
    slack = 1 + MOVED_PER_CLOCK_ERROR * max(errors.values(), default=0)
    assert summary.step_time_ms * 1e6 == pytest.approx(step["step_ns"], abs=1)
    for entry in summary.ranks:
        told = step["ranks"][str(entry.rank)]
        true = told["parts_ns"]
        assert true["small_gemm"] > 0 and true["slowdown"] > 0  # the shape this test is about
        want = parts_as_analysed(told)
        measured = {part: entry.part_ms(part) * 1e6 for part in PARTS}
        assert measured == {part: pytest.approx(want[part], abs=slack) for part in PARTS}, entry.rank


def test_without_calibration_small_gemm_and_slowdown_are_unknown_and_compute_is_measured(tmp_path):
    write_executor_run(tmp_path, build("1f1b", 4, 8), host=HOST, small_gemm=SMALL_GEMM, slowdown=SLOWDOWN)
    config = (tmp_path / "run.json").read_text()
    (tmp_path / "run.json").write_text(config.replace('"calibration"', '"not_calibration"'))
    step = json.loads((tmp_path / "truth.json").read_text())["steps"][0]
    summary = analyze_pipeline(read_run(tmp_path)).summary
    assert summary.waterfall_ms.small_batches is None and summary.waterfall_ms.interference is None
    for entry in summary.ranks:
        true = step["ranks"][str(entry.rank)]["parts_ns"]
        assert entry.small_gemm_ms is None and entry.slowdown_ms is None
        work = true["compute"] + true["small_gemm"] + true["slowdown"]
        assert entry.compute_ms * 1e6 == pytest.approx(work, abs=1)
