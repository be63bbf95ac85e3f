"""Duration events written as begin/end pairs ("B" then "E" on one thread, as other tools' Chrome traces
do) -> one complete event each, the form the rest of the analysis reads ("X", start_ns, end_ns).

The Chrome trace format says an "E" ends the latest "B" still open on the same thread (pid, tid), so
the pairs nest; they are matched in time order (file order among equal times). The pair becomes one row
where its "B" was (its index, name, category and args stand for the slice); the "E" row goes. An "E"
with nothing open, and a "B" never ended (a trace cut short), are dropped and counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl


@dataclass(frozen=True)
class Paired:
    frame: pl.DataFrame
    paired: int  # "E" events folded into their "B"
    unended: int  # "B" events without an "E", dropped
    unopened: int  # "E" events without an open "B", dropped


def has_pairs(frame: pl.DataFrame) -> bool:
    return frame.select((pl.col("ph") == "B").any() | (pl.col("ph") == "E").any()).item()


def pair_durations(frame: pl.DataFrame) -> Paired:
    """`frame` (analysis.traces.events.event_frame) with every B/E pair as one "X" row."""
    marks = (
        frame.with_row_index("row")
        .filter(pl.col("ph").is_in(["B", "E"]))
        .select("row", "ph", "pid", "tid", "start_ns")
        .sort("pid", "tid", "start_ns", "row", nulls_last=True)
    )
    ends: dict[int, int] = {}  # row of a B -> its end time
    unopened: list[int] = []
    thread, stack = None, []
    unended = 0
    for row, ph, pid, tid, start in marks.iter_rows():
        if (pid, tid) != thread:
            unended += len(stack)
            thread, stack = (pid, tid), []
        if ph == "B":
            stack.append(row)
        elif stack:
            ends[stack.pop()] = start
        else:
            unopened.append(row)
    unended += len(stack)
    paired = pl.DataFrame(
        {"row": list(ends), "pair_end": list(ends.values())}, schema={"row": pl.UInt32, "pair_end": pl.Int64}
    )
    joined = frame.with_row_index("row").join(paired, on="row", how="left", maintain_order="left")
    kept = joined.filter(~pl.col("ph").is_in(["B", "E"]) | pl.col("pair_end").is_not_null())
    out = kept.with_columns(
        ph=pl.when(pl.col("pair_end").is_not_null()).then(pl.lit("X")).otherwise("ph"),
        end_ns=pl.coalesce("pair_end", "end_ns"),
    ).drop("row", "pair_end")
    return Paired(out, len(ends), unended, len(unopened))
