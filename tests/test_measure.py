"""Calibration: each stage's whole-batch F and B sampled rank after rank; run.json keeps the medians."""

from __future__ import annotations

import torch
import torch.distributed as dist

from runners.measure import calibration, calibration_samples, pooled
from runners.model import build_stages, stage_input
from runners.presets import Preset

PRESET = Preset("test", width=16, layers_per_rank=2, rows=32, dtype="float32")


def test_every_stage_of_the_rank_is_sampled_in_index_order(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        stages = build_stages(PRESET, (10, 2), 1, torch.device("cpu"))
        samples = calibration_samples(
            stages, stage_input(PRESET, torch.device("cpu")), n_stages=11, repeats=3
        )
    finally:
        dist.destroy_process_group()
    assert list(samples) == ["2", "10"]  # by index, not as text
    for times in samples.values():
        assert {kind: len(ms) for kind, ms in times.items()} == {"F_ms": 3, "B_ms": 3}
        assert all(ms > 0 for kind in times.values() for ms in kind)
    medians = calibration(samples)
    assert medians["10"]["B_ms"] == sorted(samples["10"]["B_ms"])[1]


def test_calibration_is_each_kinds_median():
    samples = {"10": {"F_ms": [3.0, 1.0, 2.0], "B_ms": [4.0]}, "2": {"F_ms": [5.0], "B_ms": [6.0, 8.0]}}
    assert calibration(samples) == {"10": {"F_ms": 2.0, "B_ms": 4.0}, "2": {"F_ms": 5.0, "B_ms": 7.0}}


def test_rounds_pool_into_one_sample_list_per_stage_and_kind():
    rounds = [
        {"0": {"F_ms": [1.0], "B_ms": [2.0]}},
        {"0": {"F_ms": [3.0], "B_ms": [4.0]}},
        {"0": {"F_ms": [9.0], "B_ms": [5.0]}},
    ]
    assert pooled(rounds) == {"0": {"F_ms": [1.0, 3.0, 9.0], "B_ms": [2.0, 4.0, 5.0]}}
    assert calibration(pooled(rounds)) == {"0": {"F_ms": 3.0, "B_ms": 4.0}}


def test_a_step_ends_with_a_barrier_across_the_ranks(monkeypatch):
    """The worker's step: the engine's step, then a barrier, so the ranks' ProfilerStep spans end together."""
    from runners import worker

    calls = []
    monkeypatch.setattr(worker.dist, "barrier", lambda: calls.append("barrier"))
    step = worker.ended_together(lambda: calls.append("step"))
    step()
    step()
    assert calls == ["step", "barrier", "step", "barrier"]
