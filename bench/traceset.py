"""A large trace set of realistic shape, by replicating a real run's profiled steps.

Every rank's timed events are copied k times, each copy shifted by k periods (its steps' cadence: copies
follow each other as steps do; one period for all ranks, so they stay aligned), its ids (correlation,
External id, flow ids, ...) moved past the previous copy's and its steps renumbered; metadata is
written once. Times are shifted as exact decimals, so the loader's nanoseconds stay exact.
Files are written compact (more events per MB than Kineto's indented output), uncompressed or, asked,
gzipped as our runner writes its traces; the size the benchmark quotes is the uncompressed text's.
"""

from __future__ import annotations

import gzip
import re
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import msgspec

from analysis.errors import InputError
from analysis.traces.load import read_trace
from analysis.traces.run_files import trace_files

# args keys that are ids unique within a trace; a copy must not collide with the original.
ID_ARGS = ("correlation", "External id", "Record function id", "Python id", "Python parent id", "Ev Idx")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_DECODER = msgspec.json.Decoder(float_hook=Decimal)
_ENCODER = msgspec.json.Encoder(decimal_format="number")
GZIP_LEVEL = 6  # runners.profile's, gzip's default


@dataclass(frozen=True)
class RankTemplate:
    rank: int
    header: dict[str, Any]  # every top-level key but traceEvents
    once: list[dict]  # metadata (and events without a time), written once
    steps: list[dict]  # every timed event, replicated
    period_us: Decimal  # from its first step's start to where the step after its last would start
    n_steps: int
    id_span: int  # ids of a copy are shifted by multiples of this


@dataclass(frozen=True)
class TraceSet:
    path: Path
    bytes: int  # of JSON text (uncompressed)
    largest: int  # the largest rank's bytes of JSON text
    copies: int
    steps_per_rank: int
    ranks: int


def rank_template(path: Path) -> RankTemplate:
    rank = read_trace(path).rank  # validates the file, so the decode below cannot meet bad input
    if rank is None:
        raise InputError(path, "cannot tell the rank (no distributedInfo.rank, no number in the name)")
    document = _DECODER.decode(_raw_text(path))
    events = document.pop("traceEvents") if isinstance(document, dict) else document  # legacy: a bare array
    header = document if isinstance(document, dict) else {}
    steps = [e for e in events if e.get("ph") == "X" and _STEP.match(str(e.get("name", "")))]
    if not steps:
        raise InputError(path, "no ProfilerStep spans to replicate")
    spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in steps)
    starts = [start for start, _ in spans]
    # A copy starts where a next step would: one start-to-start interval after the last step's start
    # (steps may overlap a little, as Kineto's spans do; with one step, its duration), and no earlier
    # than the last step's end with the tightest end-to-start gap between the steps. The longest
    # interval: with the shortest, a 16-rank run's copy began before the previous copy's last
    # backward on rank 1 had ended, and that step lost it; the end: a last step longer than every
    # interval (179 ms after 142 and 154 on an 8-rank run) lost its last backward to the next copy.
    interval = max((b - a for a, b in zip(starts, starts[1:])), default=steps[0]["dur"])
    gap = min((b[0] - a[1] for a, b in zip(spans, spans[1:])), default=0)
    interval = max(interval, max(end for _, end in spans) + gap - starts[-1])
    # Every timed event is copied, not only those inside a step: a step's first launches precede it,
    # and a copy then overlaps the previous one's tail as a step overlaps the one before.
    timed = [e for e in events if e.get("ph") != "M" and isinstance(e.get("ts"), (int, Decimal))]
    marked = {id(e) for e in timed}
    return RankTemplate(
        rank,
        header,
        [e for e in events if id(e) not in marked],
        timed,
        starts[-1] - starts[0] + interval,
        len(steps),
        _largest_id(timed) + 1,
    )


def _largest_id(events: list[dict]) -> int:
    ids = [_as_int((e.get("args") or {}).get(key)) for e in events for key in ID_ARGS]
    ids += [_as_int(e.get("id")) for e in events]
    return max([i for i in ids if i is not None], default=0)


def _raw_text(path: Path) -> bytes:
    data = path.read_bytes()
    return gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data


def _as_int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def shifted(event: dict, copy: int, period_us: Decimal, template: RankTemplate) -> dict:
    """One event of copy `copy`: later by copy periods, ids and step number moved past earlier copies."""
    moved = dict(event, ts=event["ts"] + copy * period_us)
    offset = copy * template.id_span
    if _as_int(event.get("id")) is not None:
        moved["id"] = event["id"] + offset
    args = event.get("args")
    if args and any(_as_int(args.get(key)) is not None for key in ID_ARGS):
        moved["args"] = {
            k: v + offset if k in ID_ARGS and _as_int(v) is not None else v for k, v in args.items()
        }
    step = _STEP.match(str(event.get("name", "")))
    if step:
        moved["name"] = f"ProfilerStep#{int(step.group(1)) + copy * template.n_steps}"
    return moved


def _copy_bytes(template: RankTemplate, copy: int, period_us: Decimal) -> bytes:
    return _ENCODER.encode([shifted(e, copy, period_us, template) for e in template.steps])[1:-1]


def write_rank(path: Path, template: RankTemplate, copies: int, period_us: Decimal) -> int:
    """Stream the rank's file (one copy in memory at a time; gzipped where `path` ends in .gz); returns
    its bytes of JSON text."""
    # The header as Kineto writes it, indented ("rank": 3): HTA reads a file's rank with a regex that
    # wants the space, and takes a compact header's file for rank 0 (every file then but one is lost).
    head = msgspec.json.format(_ENCODER.encode(template.header), indent=1).rstrip()[:-1]
    once = _ENCODER.encode(template.once)[1:-1]
    opened = gzip.open(path, "wb", compresslevel=GZIP_LEVEL) if path.suffix == ".gz" else path.open("wb")
    with opened as out:
        size = out.write(head + (b"," if template.header else b"") + b'"traceEvents":[' + once)
        for copy in range(copies):
            size += out.write((b"," if once or copy else b"") + _copy_bytes(template, copy, period_us))
        size += out.write(b"]}")
    return size


def replicate_run(source: Path, target: Path, target_bytes: int, gzipped: bool = False) -> TraceSet:
    """target/rank{r}.json (.json.gz, `gzipped`) for every rank of source, about target_bytes of JSON text
    in all (at least one copy)."""
    templates = [rank_template(path) for path in trace_files(source)]
    if not templates:
        raise InputError(source, "no trace files to replicate")
    # Copies follow each other as the source's steps do; decimal sums keep the original's digits.
    period_us = max(t.period_us for t in templates)
    per_copy = sum(len(_copy_bytes(t, 0, period_us)) for t in templates)
    copies = max(1, round(target_bytes / per_copy))
    target.mkdir(parents=True, exist_ok=True)
    suffix = ".json.gz" if gzipped else ".json"
    sizes = [write_rank(target / f"rank{t.rank}{suffix}", t, copies, period_us) for t in templates]
    return TraceSet(target, sum(sizes), max(sizes), copies, copies * templates[0].n_steps, len(templates))
