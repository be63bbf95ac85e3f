"""The executor's own count of what it holds for backward: microbatches and activation bytes per rank.

The executor samples the meter inside the span of every action that stashes or frees activations, on
the wall clock (time.time_ns), which is the clock torch.profiler stamps its events with; the samples
then become Chrome counter events ("ph": "C") in the rank's trace at export, so Perfetto draws them
as counter tracks under the rank and the analysis reads them back. Engines whose action loop cannot
be instrumented (torch's schedules) count the same stash from autograd's saves instead (SavedMeter).
On CUDA a second counter holds each step's allocator peak above what was allocated when the step began.
"""

from __future__ import annotations

import os
import re
import threading
import time
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from runners.schedules.trace_names import STASH_COUNTER

_TRACE_EVENTS = re.compile(rb'"traceEvents"\s*:\s*\[')
_BASE_NS = re.compile(rb'"baseTimeNanoseconds"\s*:\s*(\d+)')


def held_bytes(stashed: Any) -> int:
    """Bytes of the distinct tensors inside a stash entry (a view counts its own elements, not its base's)."""
    seen: dict[tuple[int, int], int] = {}
    pending = [stashed]
    while pending:
        item = pending.pop()
        if isinstance(item, torch.Tensor):
            seen[(item.data_ptr(), item.nbytes)] = item.nbytes
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
        elif hasattr(item, "__dataclass_fields__"):
            pending.extend(getattr(item, name) for name in item.__dataclass_fields__)
    return sum(seen.values())


@dataclass
class StashMeter:
    """(time_ns, microbatches, bytes) each time the stash changes; entry sizes are measured once."""

    samples: list[tuple[int, int, int]] = field(default_factory=list)
    _sizes: dict[tuple, int] = field(default_factory=dict)  # (stash name, stage, microbatch) -> bytes

    def sample(self, stashes: dict[str, dict[tuple[int, int], Any]]) -> None:
        """Record what the named stashes ({(stage, microbatch): entry}) hold right now."""
        current = {(name, *key) for name, stash in stashes.items() for key in stash}
        for gone in self._sizes.keys() - current:
            del self._sizes[gone]
        for new in current - self._sizes.keys():
            self._sizes[new] = held_bytes(stashes[new[0]][new[1:]])
        microbatches = len({entry[1:] for entry in self._sizes})
        self.samples.append((time.time_ns(), microbatches, sum(self._sizes.values())))


def _micros_text(t_ns: int, base_ns: int) -> bytes:
    """Kineto's ts (microseconds after baseTimeNanoseconds) written exactly, never through a float."""
    whole, ns = divmod(abs(t_ns - base_ns), 1000)
    return f"{'-' if t_ns < base_ns else ''}{whole}.{ns:03d}".encode()


def counter_event(name: str, t_ns: int, base_ns: int, args: dict[str, int], cat: str = "pp_memory") -> bytes:
    """One Chrome counter event on this process's current thread, as JSON text."""
    values = ",".join(f'"{key}":{int(value)}' for key, value in args.items())
    return b'{"ph":"C","cat":"%s","name":"%s","pid":%d,"tid":%d,"ts":%s,"args":{%s}}' % (
        cat.encode(),
        name.encode(),
        os.getpid(),
        threading.get_native_id(),
        _micros_text(t_ns, base_ns),
        values.encode(),
    )


def stash_events(samples: Iterable[tuple[int, int, int]], base_ns: int) -> list[bytes]:
    return [
        counter_event(STASH_COUNTER, t, base_ns, {"microbatches": k, "activation_bytes": b})
        for t, k, b in samples
    ]


def base_ns(trace_json: bytes) -> int:
    """The exported trace's time origin; without one, Kineto's ts are microseconds since the epoch."""
    found = _BASE_NS.search(trace_json)
    return int(found[1]) if found else 0


def with_events(trace_json: bytes, events: list[bytes]) -> bytes:
    """The trace with `events` first in its traceEvents array (the rest is left byte for byte)."""
    if not events:
        return trace_json
    found = _TRACE_EVENTS.search(trace_json)
    if found is None:
        raise ValueError("the exported trace has no traceEvents array")
    rest = trace_json[found.end() :]
    separator = b"" if rest.lstrip().startswith(b"]") else b","
    return trace_json[: found.end()] + b",".join(events) + separator + rest


class _Held:
    """A tensor autograd saved for backward; `release` runs when the graph lets it go."""

    __slots__ = ("release", "tensor")

    def __init__(self, tensor: torch.Tensor, release: Callable[[], None]):
        self.tensor, self.release = tensor, release

    def __del__(self):
        self.release()


@dataclass
class SavedMeter:
    """The stash of an engine whose action loop cannot be instrumented (torch's schedules), sampled into
    `meter` each time it changes: the tensors autograd saves for backward
    (torch.autograd.graph.saved_tensors_hooks: pack, unpack), the stages' parameters excluded, and each
    forward's output while its Python tensor lives (the schedule keeps it for backward). That is the
    native executor's Forward: the input, every Linear's input and output, the output. A storage counts
    once whoever saves it; an entry's microbatch is the forward that saved it (the stage module's
    forwards in the step, counted by hooks on it: SavedMeter.on)."""

    meter: StashMeter
    parameters: set[int]  # storage addresses of the stages' parameters
    # storage -> [saves alive, bytes, (stage, microbatch)]
    _live: dict[int, list] = field(default_factory=dict)
    _forwards: dict[int, int] = field(default_factory=dict)  # stage -> its forwards begun this step
    _current: tuple[int, int] = (0, 0)  # (stage, microbatch) of the forward running

    def _sample(self) -> None:
        microbatches = len({key for _, _, key in self._live.values()})
        self.meter.samples.append(
            (time.time_ns(), microbatches, sum(size for _, size, _ in self._live.values()))
        )

    def _hold(self, tensor: torch.Tensor) -> Callable[[], None] | None:
        """Count `tensor`'s storage held once more; the call that lets it go, None for a parameter."""
        storage = tensor.untyped_storage()
        address = storage.data_ptr()
        if address in self.parameters:
            return None
        entry = self._live.setdefault(address, [0, storage.nbytes(), self._current])
        entry[0] += 1
        if entry[0] == 1:
            self._sample()

        def release() -> None:
            entry[0] -= 1
            if entry[0] == 0 and self._live.get(address) is entry:
                del self._live[address]
                self._sample()

        return release

    def pack(self, tensor: torch.Tensor) -> Any:
        release = self._hold(tensor)
        return tensor if release is None else _Held(tensor, release)

    @staticmethod
    def unpack(packed: Any) -> torch.Tensor:
        return packed.tensor if isinstance(packed, _Held) else packed

    def begin_step(self) -> None:
        self._forwards.clear()

    @classmethod
    def on(cls, stages: dict[int, torch.nn.Module], meter: StashMeter) -> SavedMeter:
        """A meter of these stage modules (stage index -> module), hooked on them: which microbatch's
        forward runs, and its output held."""
        saved = cls(meter, {p.untyped_storage().data_ptr() for s in stages.values() for p in s.parameters()})

        def starting(stage: int) -> Callable:
            def hook(_module: torch.nn.Module, _args: tuple) -> None:
                saved._current = (stage, saved._forwards.get(stage, 0))
                saved._forwards[stage] = saved._current[1] + 1

            return hook

        def finished(_module: torch.nn.Module, _args: tuple, output: torch.Tensor) -> None:
            release = saved._hold(output)
            if release is not None:
                weakref.finalize(output, release)

        for stage, module in stages.items():
            module.register_forward_pre_hook(starting(stage))
            module.register_forward_hook(finished)
        return saved
