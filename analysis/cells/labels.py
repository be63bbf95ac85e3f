"""A rank's `PP:<action>` labels, parsed with the IR's own parser into stage, kind and microbatch."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from analysis.cells.fused import fused_halves
from analysis.errors import InputError
from analysis.traces.spans import rows
from runners.schedules import Action, ActionParseError
from runners.schedules.trace_names import LABEL_PREFIX

# torch's runtime also labels bookkeeping (PP:0REDUCE_GRAD, PP:1UNSHARD): not actions of the IR, so
# not cells. Its gradient scaling and (un)sharding are the rank's own work outside the schedule
# (analysis.cells.labelled counts them so); DualPipeV's fused PP:(0F1;3B0)OVERLAP_F_B is not parsed as
# one: analysis.cells.fused cuts it into its F and B cells.
_HOUSEKEEPING = ("UNSHARD", "RESHARD", "REDUCE_GRAD")
TORCH_HOUSEKEEPING = rf"({'|'.join(_HOUSEKEEPING)})$"
TORCH_BOOKKEEPING = rf"({'|'.join((*_HOUSEKEEPING, 'OVERLAP_F_B'))})$"


def label_spans(frame: pl.DataFrame, source: str | Path | None = None) -> pl.DataFrame:
    """Host-side `PP:` labels parsed into stage, kind, microbatch; one row per label, two per fused
    label (its halves, `inferred`: analysis.cells.fused).

    Each distinct label text is parsed once (steps repeat them) with the IR's own parser."""
    marked = rows(
        frame,
        pl.col("name").str.starts_with(LABEL_PREFIX) & (pl.col("cat") != "gpu_user_annotation"),
        "rank",
        "tid",
        "name",
        "cat",
        "ph",
        "start_ns",
        "end_ns",
    )
    labels = marked.filter(~pl.col("name").str.contains(TORCH_BOOKKEEPING)).select(
        "rank", "tid", "name", "start_ns", "end_ns"
    )
    names = labels["name"].unique().to_list()
    actions = [_parse(name.removeprefix(LABEL_PREFIX), source) for name in names]
    parsed = pl.DataFrame(
        {
            "name": names,
            "stage": [a.stage for a in actions],
            "kind": [a.kind.value for a in actions],
            "microbatch": [a.microbatch for a in actions],
        },
        schema={"name": pl.Utf8, "stage": pl.Int64, "kind": pl.Utf8, "microbatch": pl.Int64},
    )
    plain = labels.join(parsed, on="name").drop("name").with_columns(inferred=pl.lit(False))
    return pl.concat([plain, fused_halves(marked, frame).with_columns(inferred=pl.lit(True))], how="diagonal")


def _parse(text: str, source: str | Path | None) -> Action:
    try:
        return Action.parse(text)
    except ActionParseError as error:
        raise InputError(source, f"bad pipeline label {LABEL_PREFIX}{text}: {error}") from None
