"""Real tiny-preset gloo runs: the executor's stash counter follows the schedule's in-flight count exactly,
each sample lies inside the span of the action that changed it, and the summary's peak is that many
microbatches' bytes."""

from __future__ import annotations

import polars as pl
import pytest
from conftest import trace_run

from analysis.job.run_dir import analyze_dir
from runners.execute import STASHING
from runners.schedules import build, in_flight

pytestmark = pytest.mark.slow


@pytest.fixture(
    scope="module", params=[("gpipe", 2, 4), ("1f1b", 4, 6), ("zb", 2, 4)], ids=lambda p: f"{p[0]}-p{p[1]}"
)
def analysed(request, tmp_path_factory):
    name, p, m = request.param
    traces = tmp_path_factory.mktemp(name)
    options = f"--sched {name} --p {p} --m {m} --preset tiny --device cpu --steps 1 --timed-steps 1"
    run = trace_run(traces, *options.split())
    return build(name, p, m), analyze_dir(run), run


def test_stash_counter_follows_the_schedule_exactly(analysed):
    schedule, result, _ = analysed
    theory = in_flight(schedule)
    for rank, order in enumerate(schedule.orders):
        expected = [count for action, count in zip(order, theory[rank]) if action.kind in STASHING]
        for step, samples in result.memory.stash.filter(pl.col("rank") == rank).group_by("step"):
            assert samples.sort("t_ns")["microbatches"].to_list() == expected, (rank, step)


def test_each_sample_lies_inside_its_action_span(analysed):
    """The counter and the PP: spans share one clock: the i-th sample is inside the i-th F/B/I/W cell."""
    _, result, _ = analysed
    kinds = [kind.value for kind in STASHING]
    cells = result.cells.filter(pl.col("kind").is_in(kinds)).sort("rank", "start_ns")
    samples = result.memory.stash.sort("rank", "t_ns")
    assert samples.height == cells.height > 0
    paired = pl.concat([cells.select("rank", "start_ns", "end_ns"), samples.select("t_ns")], how="horizontal")
    assert paired.filter(
        (pl.col("t_ns") < pl.col("start_ns")) | (pl.col("t_ns") > pl.col("end_ns"))
    ).is_empty()


def test_summary_peak_is_the_schedules_peak_times_a_microbatchs_bytes(analysed):
    schedule, result, _ = analysed
    first_forward = result.memory.stash.sort("rank", "t_ns").filter(pl.col("microbatches") == 1)
    per_microbatch = dict(
        first_forward.group_by("rank", maintain_order=True).agg(pl.col("bytes").first()).iter_rows()
    )
    for entry, counts in zip(result.summary.ranks, in_flight(schedule)):
        full = max(counts) * per_microbatch[entry.rank]
        if schedule.split_backward:  # after I a microbatch keeps only what W needs: less than its forward's
            assert 0 < entry.peak_activation_bytes <= full
        else:
            assert entry.peak_activation_bytes == full > 0
