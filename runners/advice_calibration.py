"""What `--calibrate-advice` times besides the calibration, in one more round after the timed steps:
what `python -m analysis advise` would otherwise assume (run.json advice_calibration). The stages at
every advised v, each a v-th of a v=1 stage, are timed by F and B and then by the executor's I and W
(runners.execute input_work, weight_work), as runners.measure times the run's own stages, and with them
what the executor's stash holds per row for one forward through each.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch
import torch.distributed as dist

from runners.execute import Forward, forward_work
from runners.measure import calibration_by_rows, calibration_samples
from runners.model import Stage
from runners.stash import held_bytes


def chunk_ids(v: int, stage_ranks: Iterable[int]) -> tuple[int, ...]:
    """The stages at v chunks per rank (each a v-th of a v=1 stage's layers, in order) that these stage
    ranks calibrate for advice: the chunks of the layers each holds at v=1."""
    return tuple(c for rank in stage_ranks for c in range(rank * v, (rank + 1) * v))


def stash_bytes_per_row(stage: Stage, batch: torch.Tensor, rows: int, is_last: bool, m: int) -> float:
    """The bytes the executor's stash holds for one forward of `rows` rows through `stage`, per row."""
    x = batch[:rows]
    with torch.no_grad():
        return held_bytes(Forward(x, *forward_work(stage, x, is_last, m)[:2])) / rows


def advice_calibration(
    chunks_of: Callable[[int], dict[int, Stage]],
    batch: torch.Tensor,
    p: int,
    vs: Iterable[int],
    row_counts: tuple[int, ...],
    own_rows: int,
    repeats: int,
    **calibrating,
) -> dict[str, dict]:
    """run.json's advice_calibration (collective): per v of `vs`, every stage of p * v (`chunks_of(v)`:
    this rank's to time) timed as calibration_samples times them (`calibrating`: its session, ranks and
    timing), F and B, then F, I and W as the executor's zb runs them, at every size of `row_counts`;
    and the stash one forward of `own_rows` rows holds there per row."""
    found = {}
    for v in vs:
        chunks, n_stages = chunks_of(v), p * v
        whole, split = (
            calibration_samples(
                chunks, batch, n_stages, row_counts, repeats, True, split=split, **calibrating
            )
            for split in (False, True)
        )
        samples = {
            stage: {
                rows: times | split[stage][rows] | {"F_ms": times["F_ms"] + split[stage][rows]["F_ms"]}
                for rows, times in by_rows.items()
            }
            for stage, by_rows in whole.items()
        }
        mine = {
            str(c): stash_bytes_per_row(chunk, batch, own_rows, c == n_stages - 1, batch.shape[0] // own_rows)
            for c, chunk in chunks.items()
        }
        gathered: list[dict[str, float]] = [{} for _ in range(dist.get_world_size())]
        dist.all_gather_object(gathered, mine)
        found[str(v)] = {
            "calibration_by_rows": calibration_by_rows(samples),
            "calibration_by_rows_samples_ms": samples,
            "stash_bytes_per_row": dict(
                sorted(((k, b) for part in gathered for k, b in part.items()), key=lambda item: int(item[0]))
            ),
        }
    return found
