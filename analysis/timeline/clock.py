"""Per-rank clock offsets from causality, so that ranks on different hosts share one time axis.

Two kinds of evidence, both in each rank's own clock:
- a pipeline transfer: the receive cannot complete before its send started, so with `offset` added to
  a rank's local times, `off[dst] - off[src] >= send_start - recv_end`. Transfers run both ways
  (activations downstream, gradients upstream), which brackets the difference from both sides; the
  midpoint is the estimate and half the bracket its uncertainty (NTP's round-trip argument). When the
  bracket holds zero the evidence shows no skew (ranks on one host share a clock), so the offset stays
  zero, with the farther bracket end as its uncertainty: the midpoint would invent a skew of half the
  difference between the two directions' transfer times.
- a collective: every rank leaves it at about the same moment, so the difference of end times is the
  difference of offsets; the median over collectives is the estimate and half their spread the
  uncertainty.
Pairs become edges between ranks; each rank is reached from the reference rank (the lowest) along the
path whose summed uncertainty is smallest.
"""

from __future__ import annotations

import heapq

import polars as pl

from analysis.cells.labelled import CELL_KEY, RankCells, cat_in
from analysis.schema import ClockEstimate, RankClock
from runners.schedules import COMM_KINDS

# A send of kind K of stage s is received by the RECV of the same microbatch at stage s + step.
_RECEIVER = {"SEND_F": ("RECV_F", 1), "SEND_B": ("RECV_B", -1)}
# Host-side collectives that block until every rank has joined (gloo); p2p ops are not collectives.
_HOST_PREFIX = "gloo:"
_HOST_COLLECTIVE = pl.col("name").str.starts_with(_HOST_PREFIX) & ~pl.col("name").str.contains("send|recv")
_NCCL = pl.col("name").str.contains("(?i)^nccl")  # a kernel's name; the device's collectives


def transfers(cells: pl.DataFrame) -> pl.DataFrame:
    """One row per pipeline transfer: each SEND cell joined to the RECV cell that takes its data.

    `cells` has the columns of analysis.cells.labelled (rank, step, stage, kind, microbatch, start_ns, end_ns).
    """
    sends = cells.filter(pl.col("kind").is_in(list(_RECEIVER))).select(
        "step",
        "microbatch",
        pl.col("kind").replace_strict({k: v[0] for k, v in _RECEIVER.items()}).alias("recv_kind"),
        (pl.col("stage") + pl.col("kind").replace_strict({k: v[1] for k, v in _RECEIVER.items()})).alias(
            "recv_stage"
        ),
        pl.col("kind").alias("send_kind"),
        send_stage="stage",
        src_rank="rank",
        send_start_ns="start_ns",
        send_end_ns="end_ns",
    )
    recvs = cells.filter(pl.col("kind").str.starts_with("RECV")).select(
        "step",
        "microbatch",
        recv_kind="kind",
        recv_stage="stage",
        dst_rank="rank",
        recv_start_ns="start_ns",
        recv_end_ns="end_ns",
    )
    return sends.join(recvs, on=["step", "microbatch", "recv_kind", "recv_stage"], how="inner")


def transfer_edges(pairs: pl.DataFrame) -> pl.DataFrame:
    """Per rank pair a < b, the bracket [lo, hi] on off[b] - off[a] from transfers in both directions."""
    bound = (
        pairs.filter(pl.col("src_rank") != pl.col("dst_rank"))
        .group_by("src_rank", "dst_rank")
        .agg((pl.col("send_start_ns") - pl.col("recv_end_ns")).max().alias("c"), pl.len().alias("n"))
    )
    forward = pl.col("src_rank") < pl.col("dst_rank")
    sided = bound.select(
        pl.min_horizontal("src_rank", "dst_rank").alias("a"),
        pl.max_horizontal("src_rank", "dst_rank").alias("b"),
        pl.when(forward).then("c").alias("lo"),
        pl.when(~forward).then(-pl.col("c")).alias("hi"),
        "n",
    )
    return (
        sided.group_by("a", "b").agg(pl.col("lo").max(), pl.col("hi").min(), pl.col("n").sum()).sort("a", "b")
    )


def collective_events(events: pl.DataFrame) -> pl.DataFrame:
    """The host and device collectives among loaded events, with the columns collective_ends reads:
    all a rank's trace is needed for here, so the trace itself need not be kept (filtering them again
    keeps them all). The cheap tests pick the candidates, the exact ones run on those alone."""
    kernels = cat_in(events, lambda cat: cat == "kernel")
    candidates = events.select("rank", "name", "cat", "ph", "start_ns", "end_ns").filter(
        (pl.col("ph") == "X") & (pl.col("name").str.starts_with(_HOST_PREFIX) | kernels)
    )
    return candidates.filter(_HOST_COLLECTIVE | (kernels & _NCCL))


def collective_ends(events: pl.DataFrame, exclude: pl.DataFrame | None = None) -> pl.DataFrame:
    """Collective instances as (name, occurrence, rank, end_ns), where every rank saw the same count.

    `exclude` (rank, start_ns) removes device events that are pipeline transfers, not collectives.
    """
    found = collective_events(events).select("rank", "name", "start_ns", "end_ns")
    if exclude is not None and exclude.height:
        found = found.join(exclude.select("rank", "start_ns"), on=["rank", "start_ns"], how="anti")
    numbered = found.sort("start_ns").with_columns(
        pl.int_range(pl.len()).over("rank", "name").alias("occurrence")
    )
    counts = (
        numbered.group_by("name", "rank").len().group_by("name").agg(pl.col("len").n_unique().alias("kinds"))
    )
    agreed = counts.filter(pl.col("kinds") == 1).select("name")
    return numbered.join(agreed, on="name", how="semi").select("name", "occurrence", "rank", "end_ns")


def collective_edges(ends: pl.DataFrame) -> pl.DataFrame:
    """Per rank pair a < b, off[b] - off[a] as the median end-time difference, with half its spread."""
    pairs = ends.join(ends, on=["name", "occurrence"], suffix="_b").filter(pl.col("rank") < pl.col("rank_b"))
    diff = pl.col("end_ns") - pl.col("end_ns_b")
    return (
        pairs.group_by(a="rank", b="rank_b")
        .agg(
            diff.median().alias("estimate"),
            ((diff.max() - diff.min()) / 2).alias("uncertainty"),
            pl.len().alias("n"),
        )
        .sort("a", "b")
    )


def _edges(p2p: pl.DataFrame, collective: pl.DataFrame) -> list[tuple[int, int, float, float | None, str]]:
    """(a, b, off[b] - off[a], uncertainty or None, via) for every linked rank pair."""
    edges = []
    for a, b, lo, hi, _ in p2p.iter_rows():
        if lo is not None and hi is not None and lo <= 0 <= hi:
            edges.append((a, b, 0.0, max(-lo, hi), "p2p"))
        elif lo is not None and hi is not None:
            edges.append((a, b, (lo + hi) / 2, abs(hi - lo) / 2, "p2p"))
        else:  # one direction only: the bound itself is the best guess, with no bracket
            edges.append((a, b, lo if lo is not None else hi, None, "p2p"))
    edges.extend((a, b, est, unc, "collective") for a, b, est, unc, _ in collective.iter_rows())
    return edges


def _shortest_paths(ranks: list[int], edges: list) -> dict[int, tuple[float, float | None, str]]:
    """Dijkstra from the lowest rank on summed uncertainty (an unbounded edge costs more than any bounded path)."""
    unbounded = 1e18
    adjacent: dict[int, list] = {r: [] for r in ranks}
    for a, b, diff, unc, via in edges:
        cost = unbounded if unc is None else unc
        adjacent[a].append((b, diff, cost, via))
        adjacent[b].append((a, -diff, cost, via))
    reference = min(ranks)
    best: dict[int, tuple[float, float | None, str]] = {}
    queue = [(0.0, reference, 0.0, "reference")]
    while queue:
        cost, rank, offset, via = heapq.heappop(queue)
        if rank in best:
            continue
        best[rank] = (offset, None if cost >= unbounded else cost, via)
        for peer, diff, edge_cost, edge_via in adjacent[rank]:
            if peer not in best:
                heapq.heappush(queue, (cost + edge_cost, peer, offset + diff, edge_via))
    return best


def estimate(ranks: list[int], cells: pl.DataFrame | None, events: pl.DataFrame) -> ClockEstimate:
    """Offsets for `ranks` from their pipeline cells (may be None or empty) and loaded events."""
    pairs = transfers(cells) if cells is not None and cells.height else None
    p2p = (
        transfer_edges(pairs)
        if pairs is not None
        else pl.DataFrame(schema=dict.fromkeys(["a", "b", "lo", "hi", "n"], pl.Int64))
    )
    device_p2p = None if pairs is None else _p2p_device_starts(cells)
    ends = collective_ends(events, device_p2p)
    collective = collective_edges(ends)
    best = _shortest_paths(sorted(ranks), _edges(p2p, collective))
    clocks = tuple(
        RankClock(r, round(best[r][0]), None if best[r][1] is None else round(best[r][1]), best[r][2])
        if r in best
        else RankClock(r, 0, None, "unlinked")
        for r in sorted(ranks)
    )
    bad = p2p.filter(pl.col("lo") > pl.col("hi")).select("a", "b").iter_rows()
    return ClockEstimate(
        reference_rank=min(ranks),
        ranks=clocks,
        transfers=0 if pairs is None else pairs.height,
        collectives=ends.select("name", "occurrence").unique().height,
        inconsistent_pairs=tuple(tuple(pair) for pair in bad),
    )


def _p2p_device_starts(cells: pl.DataFrame) -> pl.DataFrame:
    """(rank, start_ns) of transfer cells: on GPU these are the NCCL kernels to keep out of collectives."""
    return cells.filter(pl.col("kind").is_in(COMM_KINDS)).select("rank", "start_ns")


def _shift(rank: RankCells, offset: int) -> RankCells:
    times = ("start_ns", "end_ns", "launch_ns", "issued_ns")

    return rank.map(lambda frame: frame.with_columns(pl.col(c) + offset for c in times if c in frame.columns))


def shifted_like_cells(
    frame: pl.DataFrame, clock: ClockEstimate | None, times: tuple[str, ...]
) -> pl.DataFrame:
    """Per-rank times (run-queue samples, collectives) shifted by `clock`'s offsets, as on_one_clock
    shifted their ranks' cells."""
    if clock is None:
        return frame
    offsets = pl.DataFrame(
        {"rank": [r.rank for r in clock.ranks], "offset": [r.offset_ns for r in clock.ranks]},
        schema={"rank": pl.Int64, "offset": pl.Int64},
    )
    shifted = frame.join(offsets, on="rank", how="left").with_columns(
        pl.col(times) + pl.col("offset").fill_null(0)
    )
    return shifted.select(frame.columns)


def _arrived(cells: pl.DataFrame, waits: pl.DataFrame) -> pl.DataFrame:
    """Cells with each RECV ending when its data arrived: torch's runtime only posts the receive inside
    the RECV label, and its wait (keyed by the RECV) ends later, inside the consumer. Causality holds
    for the arrival, not for the post."""
    arrival = waits.group_by(CELL_KEY).agg(arrival_ns=pl.col("end_ns").max())
    return (
        cells.join(arrival, on=CELL_KEY, how="left")
        .with_columns(end_ns=pl.max_horizontal("end_ns", "arrival_ns"))
        .drop("arrival_ns")
    )


def on_one_clock(
    per_rank: list[RankCells], ranks: list[int], collectives: pl.DataFrame
) -> tuple[list[RankCells], ClockEstimate | None]:
    """The ranks shifted onto one clock, and the estimate applied; unshifted (None) unless causality says
    their clocks differ: ranks on one host share a clock, and an estimate would invent a skew.
    `collectives`: every rank's collective_events."""
    cells = _arrived(pl.concat([r.cells for r in per_rank]), pl.concat([r.waits for r in per_rank]))
    pairs = transfers(cells)
    if pairs.filter(pl.col("send_start_ns") > pl.col("recv_end_ns")).height == 0:
        return per_rank, None
    found = estimate(sorted(ranks), cells, collectives)
    shifted = [_shift(r, found.offset_ns(int(r.cells["rank"][0]))) for r in per_rank]
    return shifted, found
