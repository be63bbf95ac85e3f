"""The engines that run a rank's step, by name: the one registry (torch-free).

The launcher validates `--engine` against ENGINES before any process starts, without importing torch;
the worker asks the chosen engine for its step builder, which imports the engine's module only then.
Each engine module defines `build_step(setup: RankSetup) -> step function` (runners.engines.protocol).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Engine:
    description: str  # what runs the step, for people (--engine's help)
    module: str  # the module whose build_step builds it; imported when the worker asks

    def step_builder(self) -> Callable[..., Callable[[], None]]:
        """The module's build_step, a runners.engines.protocol.StepBuilder (not imported here: the
        protocol names torch types and the request, which imports this registry)."""
        return importlib.import_module(self.module).build_step


ENGINES: dict[str, Engine] = {
    "native": Engine("this project's dispatch-table executor (runners/execute.py)", "runners.engines.native"),
    "torch": Engine("torch.distributed.pipelining's schedules", "runners.engines.pipelining"),
}
