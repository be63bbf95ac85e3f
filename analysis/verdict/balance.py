"""Stage imbalance as layers to move: which stage is slow, and the split of the layers that evens the
stages' work (docs/numbers.md#verdict).

A stage's work per step is the typical step's busy time of its compute actions (analysis.attribution.model).
Where the run says how many layers each stage holds (our runners' run.json: dims.layers_per_stage,
times an injected slow stage's factor), each of a stage's layers is taken to cost its stage's work over
its layer count, per action kind; the layers, in stage order, are cut into contiguous stages whose
largest work is smallest. The move is replayed: each stage's work scaled to the layers it would hold.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import replace

from analysis.attribution.replay import Step

SEARCH_ROUNDS = 60  # halvings of the bottleneck's bracket: far below a nanosecond of work


def stage_work(typical: Step) -> dict[int, dict[str, float]]:
    """stage -> kind -> its compute actions' work in one typical step, ns."""
    work: dict[int, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for order in typical.orders:
        for action in order:
            if action.kind.is_compute:
                work[action.stage][action.kind.value] += typical.inputs[action].work
    return {stage: dict(kinds) for stage, kinds in sorted(work.items())}


def layers_of(config: dict, stages: int) -> list[int] | None:
    """Each stage's layer count from run.json (dims.layers_per_stage, times the factor of a stage slowed
    by `--inject slow:S:K`); None where the run does not say."""
    per_stage = (config.get("dims") or {}).get("layers_per_stage")
    if type(per_stage) is not int or per_stage < 1:
        return None
    layers = [per_stage] * stages
    for injected in config.get("injections") or []:
        if injected.get("kind") == "slow" and 0 <= injected.get("stage", -1) < stages:
            layers[injected["stage"]] *= int(injected.get("factor", 1))
    return layers


def _cuts(costs: list[float], parts: int, bottleneck: float) -> list[int] | None:
    """Layer counts of `parts` contiguous non-empty groups, none over `bottleneck`; None where that
    cannot be done. Greedy: a group closes when the next layer would pass the bottleneck, or when each
    layer left must open a group of its own."""
    counts: list[int] = []
    total = 0.0
    for index, cost in enumerate(costs):
        if cost > bottleneck:
            return None
        unopened = parts - len(counts)
        if not counts or total + cost > bottleneck or len(costs) - index == unopened:
            if unopened == 0:
                return None
            counts.append(0)
            total = 0.0
        counts[-1] += 1
        total += cost
    return counts if len(counts) == parts else None


def even_split(layers: list[int], work: list[float]) -> list[int]:
    """The layer counts, stage by stage, whose largest stage work is smallest; each stage's layers cost
    `work[s] / layers[s]` where they came from."""
    costs = [w / n for w, n in zip(work, layers) for _ in range(n)]
    low, high = max(costs), sum(costs)
    best = list(layers)
    for _ in range(SEARCH_ROUNDS):
        middle = (low + high) / 2
        found = _cuts(costs, len(layers), middle)
        if found is None:
            low = middle
        else:
            best, high = found, middle
    return best


def moved(typical: Step, layers: list[int], split: list[int]) -> Step:
    """`typical` with each stage's work per kind as its layers under `split` cost (layer by layer, at
    the cost per layer of the stage each came from)."""
    work = stage_work(typical)
    stages = sorted(work)
    origin = [s for s, n in zip(stages, layers) for _ in range(n)]
    scaled: dict[tuple[int, str], float] = {}
    first = 0
    for stage, count in zip(stages, split):
        for kind, ns in work[stage].items():
            wanted = sum(
                work[o].get(kind, 0.0) / layers[stages.index(o)] for o in origin[first : first + count]
            )
            scaled[(stage, kind)] = wanted / ns if ns else 1.0
        first += count
    inputs = {
        a: replace(i, work=i.work * scaled.get((a.stage, a.kind.value), 1.0)) if a.kind.is_compute else i
        for a, i in typical.inputs.items()
    }
    return replace(typical, inputs=inputs)


def moves(layers: list[int], split: list[int]) -> str:
    """The boundaries that move, in words: "move 4 layers from stage 1 to stage 0"."""
    said, before, after = [], 0, 0
    for boundary in range(len(layers) - 1):
        before += layers[boundary]
        after += split[boundary]
        shift = before - after  # layers that cross this boundary, towards the later stage where positive
        if shift > 0:
            said.append(f"{shift} layer(s) from stage {boundary} to stage {boundary + 1}")
        elif shift < 0:
            said.append(f"{-shift} layer(s) from stage {boundary + 1} to stage {boundary}")
    return "move " + "; ".join(said) if said else "keep the split"
