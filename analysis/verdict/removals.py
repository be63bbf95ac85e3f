"""The pieces of the waterfall's host, transfer and tail effects that one change goes after, each with
what it would recover: the typical step (analysis.attribution.model) replayed without that piece
(docs/numbers.md#recoverable). Host time off the critical path recovers nothing, however large.

The pieces, each taken from the typical step's inputs, under the effect whose time it is
(analysis.attribution.waterfall.EFFECTS):

- host: one rank's host time (lead, pre and post) in the actions of one kind;
- transfer: one hop's transfers (a stage's SEND and its neighbour's RECV of that direction);
- tail: one rank's work outside the schedule after its last action, or its host time there, and every
  rank's exposed DP sync together (dp_sync: overlapping the gradient buckets removes it on all ranks at
  once).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from analysis.attribution.model import StepModel
from analysis.attribution.replay import Inputs, Step, replay_all
from analysis.vocabulary import Effect, GapClass
from runners.schedules import Action, Schedule

NS_PER_MS = 1e6
_HOST = ("lead", "pre", "post")
# a transfer's receive kind -> the stage step from its sender
_HOP = {"RECV_F": -1, "RECV_B": 1}
_SEND_OF = {"RECV_F": "SEND_F", "RECV_B": "SEND_B"}


@dataclass(frozen=True)
class Removal:
    """One time taken away from the typical step: what it is, where, how much the step held."""

    effect: Effect  # the waterfall effect it is a piece of
    kind: str  # the finding it makes: its effect's name, or dp_sync
    rank: int | None
    stage: int | None
    what: str  # the time in words: "rank 0's F host time", "the hop 0->1 (activations)"
    held_ns: float  # its total in one typical step, on and off the critical path


@dataclass(frozen=True)
class Recovered:
    removal: Removal
    recoverable_ns: float  # the typical step less its replay without the removal's time


def _host_free(inputs: Inputs) -> Inputs:
    return replace(inputs, lead=0.0, pre=0.0, post=0.0)


def _host_removals(schedule: Schedule, typical: Step) -> list[tuple[Removal, Step]]:
    """Per rank and action kind its host time gone."""
    found = []
    for rank, order in enumerate(typical.orders):
        for kind in sorted({a.kind.value for a in order}):
            mine = [a for a in order if a.kind.value == kind]
            held = sum(getattr(typical.inputs[a], f) for a in mine for f in _HOST)
            if held <= 0:
                continue
            inputs = dict(typical.inputs) | {a: _host_free(typical.inputs[a]) for a in mine}
            stage = mine[0].stage if len({a.stage for a in mine}) == 1 else None
            removal = Removal(Effect.HOST, Effect.HOST, rank, stage, f"rank {rank}'s {kind} host time", held)
            found.append((removal, replace(typical, inputs=inputs)))
    return found


def _tail_removal(typical: Step, rank: int, part: GapClass, what: str) -> list[tuple[Removal, Step]]:
    """One rank's tail without its time of class `part` (a field of its Tail)."""
    held = getattr(typical.tails[rank], part) if rank < len(typical.tails) else 0.0
    if held <= 0:
        return []
    tails = list(typical.tails)
    tails[rank] = replace(tails[rank], **{part: 0.0})
    return [(Removal(Effect.TAIL, Effect.TAIL, rank, None, what, held), replace(typical, tails=tails))]


def _hop_removals(schedule: Schedule, typical: Step) -> list[tuple[Removal, Step]]:
    """Per hop (a receiving stage and direction) its transfers gone, on both sides."""
    hops: dict[tuple[int, str], list[Action]] = {}
    for order in typical.orders:
        for a in order:
            if a.kind.value in _HOP:
                hops.setdefault((a.stage, a.kind.value), []).append(a)
    found = []
    for (stage, kind), receives in sorted(hops.items()):
        sender = stage + _HOP[kind]
        sends = [
            a
            for order in typical.orders
            for a in order
            if a.stage == sender and a.kind.value == _SEND_OF[kind]
        ]
        mine = receives + sends
        held = sum(typical.inputs[a].transfer for a in mine)
        if held <= 0:
            continue
        inputs = dict(typical.inputs) | {a: replace(typical.inputs[a], transfer=0.0) for a in mine}
        direction = "activations" if kind == "RECV_F" else "gradients"
        what = f"the hop {sender}->{stage} ({direction})"
        removal = Removal(Effect.TRANSFER, Effect.TRANSFER, schedule.rank_of(stage), stage, what, held)
        found.append((removal, replace(typical, inputs=inputs)))
    return found


def _tail_removals(typical: Step) -> list[tuple[Removal, Step]]:
    """Per rank its work outside the schedule, and its host time after its last action, gone; every
    rank's exposed DP sync gone together."""
    found = []
    for rank in range(len(typical.tails)):
        found += _tail_removal(typical, rank, GapClass.OTHER, f"rank {rank}'s work after its last action")
        found += _tail_removal(
            typical, rank, GapClass.LAUNCH_OVERHEAD, f"rank {rank}'s host time after its last action"
        )
    synced = sum(t.dp_sync for t in typical.tails)
    if synced > 0:
        tails = [replace(t, dp_sync=0.0) for t in typical.tails]
        removal = Removal(Effect.TAIL, GapClass.DP_SYNC, None, None, "the exposed DP gradient sync", synced)
        found.append((removal, replace(typical, tails=tails)))
    return found


def recovered(schedule: Schedule, model: StepModel) -> tuple[float, list[Recovered]]:
    """The typical step's replay (ns) and every removal's recoverable time, largest first."""
    typical = model.step()
    removals = [
        *_host_removals(schedule, typical),
        *_hop_removals(schedule, typical),
        *_tail_removals(typical),
    ]
    replayed = replay_all(schedule, [typical, *(step for _, step in removals)])
    base = replayed[0].makespan
    found = [Recovered(removal, base - r.makespan) for (removal, _), r in zip(removals, replayed[1:])]
    return base, sorted(found, key=lambda f: -f.recoverable_ns)
