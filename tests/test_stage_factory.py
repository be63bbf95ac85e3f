"""--model: a factory's stages are checked before the run (one line per problem), adapted for the
executors, stacked K times by `slow`, and trained as plain autograd would; the options a custom model
cannot have are refused in one line."""

from __future__ import annotations

import re
import subprocess
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO, summary_of, trace_command
from torch import nn

from analysis.report.run_tables import config_html
from analysis.report.runs import Run
from runners.engines import single_gpu
from runners.engines.protocol import RankSetup
from runners.examples.transformer_block import SEQUENCE, Block
from runners.execute import StepContext, run_step
from runners.launch import torchrun_command
from runners.model import loss_of, split_microbatches, stage_input
from runners.presets import Preset
from runners.request import RequestError, Resolved, RunRequest, resolve
from runners.runqueue import RunQueueMeter
from runners.schedules import build, lower
from runners.schedules.single_gpu import SINGLE_GPU
from runners.stage_factory import ModuleStage, StageInfo, checked_sample_shape, rank_stages
from runners.stash import StashMeter

EXAMPLE = "runners.examples.transformer_block:stage"
HERE = "test_stage_factory"  # this module, importable in the test process: its factories below
PRESET = Preset("test", width=16, layers_per_rank=2, rows=8, dtype="float64")
LR = 0.5


def widening(info: StageInfo) -> nn.Module:
    return nn.Linear(info.width, 2 * info.width, device=info.device, dtype=info.dtype)


def parameterless(info: StageInfo) -> nn.Module:
    return nn.GELU()


def not_a_module(info: StageInfo) -> int:
    return 42


def failing(info: StageInfo) -> nn.Module:
    raise ValueError("no such width")


class Cast(nn.Module):
    """A stage whose output leaves the run's dtype, or (detach) its autograd graph."""

    def __init__(self, info: StageInfo, detach: bool = False, sample_shape: object = None):
        super().__init__()
        self.linear = nn.Linear(info.width, info.width, device=info.device, dtype=info.dtype)
        self.detach = detach
        if sample_shape is not None:
            self.sample_shape = sample_shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.linear(x)
        return y.detach() if self.detach else y.double()


def to_double(info: StageInfo) -> nn.Module:
    return Cast(info)


def detached(info: StageInfo) -> nn.Module:
    return Cast(info, detach=True)


def text_shape(info: StageInfo) -> nn.Module:
    return Cast(info, sample_shape="16x64")


def sequence_from_stage_1(info: StageInfo) -> nn.Module:
    """Stage 0 takes (width,) samples, the others (SEQUENCE, width): they disagree."""
    if info.stage:
        return Block(info.width, info.device, info.dtype)
    return nn.Linear(info.width, info.width, device=info.device, dtype=info.dtype)


def resolved(model: str, schedule: str = "gpipe", engine: str = "native", v: int = 1) -> Resolved:
    return resolve(RunRequest(schedule, 2, 4, v, engine, "tiny", device="cpu", model=model), lambda: 0)


@pytest.mark.parametrize(
    "model, words",
    [
        ("transformer_block", "write package.module:factory"),
        ("runners.examples:transformer_block:stage", "write package.module:factory"),
        ("no_such_package.model:stage", "cannot import no_such_package.model (ModuleNotFoundError"),
        ("runners.examples.transformer_block:no_such_factory", "has no function no_such_factory"),
        ("runners.examples.transformer_block:SEQUENCE", "has no function SEQUENCE"),
        (f"{HERE}:failing", "stage 0: ValueError: no such width"),
        (f"{HERE}:not_a_module", "returned int, not a torch.nn.Module"),
        (f"{HERE}:parameterless", "stage 0 has no trainable parameters"),
        (f"{HERE}:widening", "maps a (16, 64) torch.float32 input to (16, 128) torch.float32"),
        (f"{HERE}:to_double", "to (16, 64) torch.float64; every stage's output must have its input's"),
        (f"{HERE}:detached", "backward cannot start from"),
        (f"{HERE}:text_shape", "sample_shape '16x64'; it must be a tuple of positive whole numbers"),
        (
            f"{HERE}:sequence_from_stage_1",
            f"stage 1 takes samples of shape ({SEQUENCE}, 64) but stage 0 gives (64,)",
        ),
    ],
)
def test_a_bad_model_is_refused_in_one_line_before_the_run(model, words):
    with pytest.raises(RequestError) as error:
        checked_sample_shape(resolved(model))
    assert words in str(error.value) and "\n" not in str(error.value)


def test_the_split_backward_is_refused_on_the_native_engine_only():
    """zb's W needs each Linear's taps, which only the built-in stack exposes; torch splits any module."""
    with pytest.raises(RequestError, match="splits each backward into I and W") as error:
        resolved(EXAMPLE, "zb")
    assert "--engine torch" in str(error.value) and "\n" not in str(error.value)
    assert checked_sample_shape(resolved(EXAMPLE, "zb", "torch", v=2)) == (SEQUENCE, 64)


def test_any_v_suits_a_custom_model():
    """The tiny preset's 2 layers per rank refuse v=4 for the built-in stack, not for a factory's stages."""
    with pytest.raises(RequestError, match="v=4 must divide"):
        resolved(None, "interleaved", v=4)
    assert resolved(EXAMPLE, "interleaved", v=4).request.v == 4


def test_the_cli_refuses_a_model_that_does_not_import_in_one_line(tmp_path):
    options = "--sched gpipe --p 2 --m 4 --preset tiny --device cpu --model no_such_package.model:stage"
    result = subprocess.run(
        trace_command(tmp_path, *options.split()), cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 2 and "cannot import no_such_package.model" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1 and not any(tmp_path.iterdir())


def test_the_workers_get_the_model(tmp_path):
    command = torchrun_command(resolved(EXAMPLE), tmp_path)
    assert command[command.index("--model") + 1] == EXAMPLE
    assert "--model" not in torchrun_command(resolved(None), tmp_path)


def test_the_example_checks_and_a_slowed_stage_holds_k_blocks():
    run = resolved(EXAMPLE, "gpipe")
    assert checked_sample_shape(run) == (SEQUENCE, 64)
    stages = rank_stages(run, (0, 1), 2, torch.device("cpu"), layer_factors={1: 3})
    assert all(isinstance(stage, ModuleStage) for stage in stages.values())
    counts = [sum(p.numel() for p in stages[s].parameters()) for s in (0, 1)]
    assert counts[1] == 3 * counts[0]
    x = torch.randn(2, SEQUENCE, 64)
    output, taps = stages[1].forward_with_taps(x)
    assert output.shape == x.shape and taps == []


def test_one_native_step_of_the_example_equals_full_batch_sgd():
    """Two chunks on one rank (the in-memory hand-over), two microbatches: the executor's SGD step on
    the transformer stages equals plain autograd's on the whole batch."""
    run = Resolved(RunRequest("interleaved", 1, 2, 2, model=EXAMPLE), "cpu", "gloo", PRESET)
    schedule = lower(build("interleaved", 1, 2, 2))
    batch = stage_input(PRESET, torch.device("cpu"), checked_sample_shape(run))
    stages = rank_stages(run, (0, 1), 2, torch.device("cpu"))
    reference = rank_stages(run, (0, 1), 2, torch.device("cpu"))
    loss_of(reference[1](reference[0](batch)), 1).backward()
    ctx = StepContext(0, 2, schedule.rank_of, stages, None, split_microbatches(batch, 2))
    run_step(
        ctx, schedule.orders[0], torch.optim.SGD([p for s in stages.values() for p in s.parameters()], lr=LR)
    )
    for s in (0, 1):
        for got, want in zip(stages[s].parameters(), reference[s].parameters()):
            assert not torch.equal(got, want)  # the step moved the weights
            torch.testing.assert_close(got, want - LR * want.grad)


def test_one_single_gpu_step_of_the_example_equals_full_batch_sgd():
    """P=2 ranks as streams of one process (torch.cpu's stand-ins here): the same step as plain autograd."""
    run = Resolved(RunRequest("1f1b", 2, 4, model=EXAMPLE), "cpu", "gloo", PRESET, SINGLE_GPU)
    schedule = lower(build("1f1b", 2, 4))
    batch = stage_input(PRESET, torch.device("cpu"), checked_sample_shape(run))
    stages = rank_stages(run, (0, 1), 2, torch.device("cpu"))
    reference = rank_stages(run, (0, 1), 2, torch.device("cpu"))
    loss_of(reference[1](reference[0](batch)), 1).backward()
    optimizer = torch.optim.SGD([p for s in stages.values() for p in s.parameters()], lr=LR)
    single_gpu.build_step(
        RankSetup(run, schedule, 0, stages, batch, optimizer, StashMeter(), RunQueueMeter())
    )()
    for s in (0, 1):
        for got, want in zip(stages[s].parameters(), reference[s].parameters()):
            torch.testing.assert_close(got, want - LR * want.grad)


def test_the_run_page_shows_the_model(tmp_path):
    run = Run("run", tmp_path, {"model": EXAMPLE}, SimpleNamespace(summary=summary_of()))
    assert EXAMPLE in config_html(run)
    assert "model" not in config_html(
        Run("run", tmp_path, {"model": None}, SimpleNamespace(summary=summary_of()))
    )


def test_the_guides_factory_checks_as_written(tmp_path, monkeypatch):
    section = (REPO / "docs" / "guide.md").read_text().split("## Your own model", 1)[1]
    (tmp_path / "my_stages.py").write_text(re.search(r"```python\n(.*?)```", section, re.S).group(1))
    monkeypatch.syspath_prepend(tmp_path)
    assert checked_sample_shape(resolved("my_stages:stage", "1f1b")) == (64,)
