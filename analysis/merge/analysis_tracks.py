"""The merged trace's analysis tracks: per rank one thread each for the classified gaps (gaps.parquet),
the small-GEMM excess of every compute cell (cells.parquet) and, optionally, the simulated ideal step.

The analysis tables are on the analysis's clock: where causality demanded it, `analyze` shifted ranks
by the offsets in summary.json `clock`. Those are undone here before the merge's own shift applies, so
the tracks line up with the rank's real events whichever clock estimate each side used.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import polars as pl

from analysis.errors import InputError
from analysis.timeline.gaps import COMPUTE_KINDS
from analysis.ideal import ideal_replay
from analysis.merge.tracks import RankTracks, thread_events

GAPS_TRACK = "analysis · gaps (bubble, p2p wait, launch overhead, other)"
SMALL_GEMM_TRACK = "analysis · small-GEMM excess"
IDEAL_TRACK = "analysis · ideal"
_ACTION = pl.format("{}{}{}", "stage", "kind", "microbatch")  # the IR's compact form, as in PP: labels


@dataclass(frozen=True)
class Placement:
    """How analysis times of each rank become merged-trace times: + delta_ns (a frame: rank, delta_ns)."""

    delta: pl.DataFrame
    steps: tuple[int, ...] | None

    def place(self, frame: pl.DataFrame) -> pl.DataFrame:
        """Rows of the kept steps, start_ns and end_ns moved onto the merged trace's clock."""
        if self.steps is not None:
            frame = frame.filter(pl.col("step").is_in(self.steps))
        moved = frame.join(self.delta, on="rank")
        return moved.with_columns(pl.col("start_ns", "end_ns") + pl.col("delta_ns")).drop("delta_ns")


def analysis_tracks(analysis_dir: Path | None, tracks: dict[int, RankTracks], shift: dict[int, int], origin: int,
                    steps: tuple[int, ...] | None, notes: list[str]) -> list[dict]:  # fmt: skip
    """Every analysis track's thread names and slices; what is left out, and why, goes to `notes`."""
    gaps = _read_table(analysis_dir, "gaps") if analysis_dir is not None else None
    if gaps is None:
        notes.append("no analysis/gaps.parquet beside the traces: analysis tracks left out (run `python -m analysis analyze`)")
        return []
    summary = _read_json(analysis_dir / "summary.json") or {}
    applied = {int(r): v["offset_ns"] for r, v in ((summary.get("clock") or {}).get("ranks") or {}).items()}
    delta = pl.DataFrame(
        {"rank": list(tracks), "delta_ns": [shift[r] - applied.get(r, 0) - origin for r in tracks]},
        schema={"rank": pl.Int64, "delta_ns": pl.Int64},
    )
    placement = Placement(delta, steps)
    cells = _read_table(analysis_dir, "cells")
    named = {
        GAPS_TRACK: placement.place(gaps).select("rank", "start_ns", "end_ns", "step", name="class"),
        SMALL_GEMM_TRACK: _small_gemm(cells, placement, notes),
    }
    run_json = _read_json(analysis_dir.parent / "run.json") or {}
    named[IDEAL_TRACK] = _ideal(summary, run_json.get("calibration"), cells, placement, notes)
    out = []
    for rank, track in tracks.items():
        first = max((t for t, _ in track.threads), default=0) + 1
        drawn = [(tid, name, frame) for tid, (name, frame) in enumerate(named.items(), first) if frame is not None]
        out.extend(thread_events(rank, [(tid, name) for tid, name, _ in drawn]))
        out.extend(event for tid, _, frame in drawn for event in _slices(frame.filter(pl.col("rank") == rank), tid))
    return out


def _read_json(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        loaded = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise InputError(path, f"is not readable JSON ({error})") from None
    if not isinstance(loaded, dict):
        raise InputError(path, "is not a JSON object")
    return loaded


def _read_table(analysis_dir: Path, name: str) -> pl.DataFrame | None:
    path = analysis_dir / f"{name}.parquet"
    if not path.exists():
        return None
    try:
        return pl.read_parquet(path)
    except (OSError, pl.exceptions.PolarsError) as error:
        raise InputError(path, f"is not a readable table ({type(error).__name__}); re-run `python -m analysis analyze`") from None


def _small_gemm(cells: pl.DataFrame | None, placement: Placement, notes: list[str]) -> pl.DataFrame | None:
    """Per compute cell with an excess, a slice over the cell's last `small_gemm_ns` (the part beyond
    the reference), named with its action."""
    if cells is None or "small_gemm_ns" not in cells.columns:
        notes.append("analysis/cells.parquet lacks small_gemm_ns: small-GEMM track left out (re-run analyze)")
        return None
    if cells["small_gemm_ns"].is_null().all():
        notes.append("no calibration in run.json, so no reference to measure excess against: small-GEMM track left out")
        return None
    excess = placement.place(cells.filter(pl.col("small_gemm_ns") > 0))
    return excess.select(
        "rank", "step", "end_ns", name=_ACTION,
        start_ns=pl.col("end_ns") - pl.col("small_gemm_ns").round().cast(pl.Int64),
    )  # fmt: skip


def _ideal(summary: dict, calibration: dict | None, cells: pl.DataFrame | None, placement: Placement,
           notes: list[str]) -> pl.DataFrame | None:  # fmt: skip
    """The schedule replayed with reference durations (analysis.ideal) for one step, from where that
    step's first measured action began: the summary's median step, else the first step kept."""
    compute = None if cells is None else placement.place(cells.filter(pl.col("kind").is_in(COMPUTE_KINDS)))
    schedule, timeline, caption = ideal_replay({**summary, "calibration": calibration}, cells)
    if timeline is None or compute is None or compute.height == 0:
        notes.append(f"ideal track left out: {caption if timeline is None else 'no measured cells in the kept steps'}")
        return None
    kept = compute["step"].unique()
    step = summary.get("median_step") if summary.get("median_step") in kept else kept.min()
    start = compute.filter(pl.col("step") == step)["start_ns"].min()
    rows = [(rank, str(action), start + round(begin * 1e6), start + round(end * 1e6))
            for rank, action, begin, end in timeline.rows]  # fmt: skip
    notes.append(f"ideal track: step {step}. {caption}")
    return pl.DataFrame(rows, schema=["rank", "name", "start_ns", "end_ns"], orient="row").with_columns(step=pl.lit(step))


def _slices(frame: pl.DataFrame, tid: int) -> list[dict]:
    """Chrome complete events on thread `tid` from rows (rank, name, start_ns, end_ns, step)."""
    return [
        {"ph": "X", "name": name, "cat": "analysis", "pid": rank, "tid": tid, "ts": start / 1000,
         "dur": (end - start) / 1000, "args": {"step": step}}  # fmt: skip
        for rank, name, start, end, step in frame.select("rank", "name", "start_ns", "end_ns", "step").iter_rows()
    ]
