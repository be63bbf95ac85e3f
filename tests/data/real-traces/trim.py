"""Cut a large Kineto trace down to a contiguous time window, keeping it a valid trace of the same job.

    python tests/data/real-traces/trim.py SOURCE.json.gz DEST.json.gz --steps 6 7
    python tests/data/real-traces/trim.py SOURCE.json.gz DEST.json.gz --window-ms 0 30

The window is the host span of the named ProfilerStep#N events (--steps), or --window-ms A B measured
from the earliest event. Kept, in the file's own order and byte for byte as written (times keep their
exact text):

- every top-level key but traceEvents, and every metadata ("M") event;
- host events that overlap the window ("X") or lie in it (instants, counters), except ProfilerStep
  spans other than the named ones;
- device events (kernels, memcpy, memset, syncs) whose host launch (same correlation id) was kept;
  device events with no launch in the file, and GPU-side annotations, where they overlap the kept
  device work;
- flow events ("s"/"f") whose anchor event (same pid, tid and ts) was kept, and of a flow that had both
  ends in the source only when both ends are kept.
"""

from __future__ import annotations

import argparse
import gzip
import sys
from collections import defaultdict
from pathlib import Path

import msgspec

DEVICE_CATS = {
    "kernel",
    "Kernel",
    "gpu_memcpy",
    "Memcpy",
    "gpu_memset",
    "Memset",
    "cuda_sync",
    "gpu_user_annotation",
}
FLOW_PHASES = {"s", "t", "f"}


def _step(event: dict) -> int | None:
    name = event.get("name")
    if isinstance(name, str) and name.startswith("ProfilerStep#") and event.get("ph") == "X":
        return int(name.removeprefix("ProfilerStep#"))
    return None


def _correlation(event: dict):
    args = event.get("args")
    return args.get("correlation") if isinstance(args, dict) else None


def _anchor(event: dict) -> tuple:
    return event.get("pid"), str(event.get("tid")), event.get("ts")


def keep_mask(
    events: list[dict], steps: set[int] | None, window_us: tuple[float, float] | None
) -> list[bool]:
    timed = [e for e in events if isinstance(e.get("ts"), (int, float)) and e.get("ph") != "M"]
    if steps:
        spans = [e for e in timed if _step(e) in steps and e.get("cat") not in DEVICE_CATS]
        missing = steps - {_step(e) for e in spans}
        if missing:
            raise SystemExit(f"no host ProfilerStep#{sorted(missing)} in the source")
        t0, t1 = min(e["ts"] for e in spans), max(e["ts"] + e.get("dur", 0) for e in spans)
    else:
        origin = min(e["ts"] for e in timed)
        t0, t1 = origin + window_us[0], origin + window_us[1]

    def in_window(e: dict) -> bool:
        start = e["ts"]
        if e.get("ph") == "X":
            end = start + (e.get("dur") or 0)
            return start < t1 and (end > t0 or start >= t0)
        return t0 <= start < t1

    keep = [False] * len(events)
    host_correlations = {
        _correlation(e) for e in events if e.get("cat") not in DEVICE_CATS and e.get("ph") == "X"
    }
    kept_launches = set()
    for i, e in enumerate(events):
        if e.get("ph") == "M" or not isinstance(e.get("ts"), (int, float)):
            keep[i] = True
        elif e.get("ph") in FLOW_PHASES or e.get("cat") in DEVICE_CATS:
            continue
        elif _step(e) is not None and steps is not None:
            keep[i] = _step(e) in steps
        else:
            keep[i] = in_window(e)
        if keep[i] and e.get("ph") == "X" and _correlation(e) is not None:
            kept_launches.add(_correlation(e))
    device_span = [float("inf"), float("-inf")]
    for i, e in enumerate(events):
        if e.get("cat") in DEVICE_CATS and e.get("ph") == "X" and _correlation(e) in kept_launches:
            keep[i] = True
            device_span = [min(device_span[0], e["ts"]), max(device_span[1], e["ts"] + (e.get("dur") or 0))]
    for i, e in enumerate(events):
        if keep[i] or e.get("cat") not in DEVICE_CATS or e.get("ph") != "X":
            continue
        if _step(e) is not None and steps is not None and _step(e) not in steps:
            continue
        if _correlation(e) in host_correlations and e.get("cat") != "gpu_user_annotation":
            continue  # its launch is outside the window
        keep[i] = e["ts"] < device_span[1] and e["ts"] + (e.get("dur") or 0) > device_span[0]
    anchors = {_anchor(e) for e, k in zip(events, keep) if k and e.get("ph") == "X"}
    flows: dict[tuple, list[int]] = defaultdict(list)
    for i, e in enumerate(events):
        if e.get("ph") in FLOW_PHASES:
            flows[(e.get("cat"), e.get("id"))].append(i)
    for members in flows.values():
        bound = [_anchor(events[i]) in anchors for i in members]
        phases = {events[i]["ph"] for i in members}
        if {"s", "f"} <= phases:  # a whole flow in the source: both ends or none
            if all(bound):
                for i in members:
                    keep[i] = True
        else:
            for i, b in zip(members, bound):
                keep[i] = b
    return keep


def trim(
    source: Path, dest: Path, steps: set[int] | None, window_us: tuple[float, float] | None
) -> tuple[int, int]:
    top = msgspec.json.decode(gzip.decompress(source.read_bytes()), type=dict[str, msgspec.Raw])
    raw_events = msgspec.json.decode(top["traceEvents"], type=list[msgspec.Raw])
    events = [msgspec.json.decode(r) for r in raw_events]
    keep = keep_mask(events, steps, window_us)
    kept = [bytes(r) for r, k in zip(raw_events, keep) if k]
    parts = []
    for key, value in top.items():
        text = b"[\n  " + b",\n  ".join(kept) + b"\n]" if key == "traceEvents" else bytes(value)
        parts.append(msgspec.json.encode(key) + b": " + text)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_bytes(gzip.compress(b"{\n  " + b",\n  ".join(parts) + b"\n}\n", 9, mtime=0))
    return len(events), len(kept)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path)
    parser.add_argument("dest", type=Path)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--steps", type=int, nargs="+", help="ProfilerStep numbers to keep (a contiguous run)")
    group.add_argument("--window-ms", type=float, nargs=2, metavar=("A", "B"), help="from the earliest event")
    args = parser.parse_args(argv)
    window = None if args.steps else (args.window_ms[0] * 1000, args.window_ms[1] * 1000)
    before, after = trim(args.source, args.dest, set(args.steps) if args.steps else None, window)
    print(f"{args.dest}: {after} of {before} events, {args.dest.stat().st_size} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
