"""Fuzz the whole analysis (load -> cells -> gaps -> decompose -> summary.json) with mutated run
directories, synthetic and real: it either writes a summary whose every rank closes on the step time,
or refuses with one InputError line and writes nothing. Any other exception is a bug.

A whole analysis costs ~10x a loader example, so each test here runs FUZZ_EXAMPLES // 10 inputs (at
least 10; `make fuzz` sets FUZZ_EXAMPLES=20000).
"""

from __future__ import annotations

import copy
import json
import math
import os
import re
import shutil
import warnings
from pathlib import Path

import pytest
from conftest import gunzipped, real_traces_in
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis.errors import InputError
from analysis.job.run_dir import analyze_dir
from runners.schedules import build
from synthetic.generate import synthesize
from synthetic.truth import Work, calibration

EXAMPLES = max(10, int(os.environ.get("FUZZ_EXAMPLES", "40")) // 10)
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=EXAMPLES < 100,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
PARTS = ("compute_ms", "small_gemm_ms", "launch_overhead_ms", "p2p_wait_ms", "bubble_ms", "other_ms")
KINDS = ("F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B", "X")

Run = tuple[dict[str, dict | list], dict | None]  # file name -> trace document, run.json


def _synthetic(name: str, p: int, m: int, v: int = 1, shape: str = "cpu") -> Run:
    schedule = build(name, p, m, v)
    made = synthesize(schedule, steps=2, shape=shape, p2p_latency_us=20, launch_gap_us=5, run_id=name)
    config = {
        "schedule": name,
        "p": p,
        "m": m,
        "v": v,
        "device": "cuda" if shape == "gpu" else "cpu",
        "calibration": calibration(schedule, Work({"F": 1000.0, "B": 2000.0})),
        "complete": True,
    }
    return {f"rank{rank}.json": trace for rank, trace in made.traces.items()}, config


def _real(folder: str) -> Run:
    traces = {path.name.removesuffix(".gz"): json.loads(gunzipped(path)) for path in real_traces_in(folder)}
    return traces, None


# The real seeds (folders of tests/data/real-traces) and what each comes to unmutated: neither is a
# whole pipeline run, so the fuzz reaches the analysis through them only where an edit gets past this.
REAL_SEEDS_REFUSED = {
    # 2 of the 128 ranks of HTA's sampled job, which neither send nor receive: the trust gate's refusal
    "hta/trace_filter": "not a pipeline-parallel job: its 2 rank(s) here of 128 show no send/recv",
    "pippy": "cannot tell the rank",  # PiPPy's files have neither distributedInfo nor a rank in the name
}
SEEDS: list[Run] = [
    _synthetic("1f1b", 2, 4),
    _synthetic("1f1b", 2, 4, shape="gpu"),
    _synthetic("interleaved", 2, 4, v=2),
    _synthetic("zb", 2, 2),
    *(_real(folder) for folder in REAL_SEEDS_REFUSED),
]

JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=4,
)
LABELS = st.builds("PP:{}{}{}".format, st.integers(-1, 9), st.sampled_from(KINDS), st.integers(-1, 9))
STEPS = st.builds("ProfilerStep#{}".format, st.integers(-1, 5))
EVENT_KEYS = st.sampled_from(["ts", "dur", "name", "ph", "cat", "tid", "pid", "args", "id"])
# (which event, key, new value or ... to delete it)
EVENT_EDITS = st.tuples(
    st.floats(0, 1), EVENT_KEYS, JSON_VALUES | LABELS | STEPS | st.floats(-1e4, 1e4) | st.just(...)
)
RUN_KEYS = st.sampled_from(["schedule", "p", "m", "v", "calibration", "complete", "device"])


def _events(trace: dict | list) -> list:
    return trace if isinstance(trace, list) else trace["traceEvents"]


def _pick(items: list, where: float):
    return items[min(int(where * len(items)), len(items) - 1)]


def _edit_event(event: dict, key: str, value) -> None:
    if value is ...:
        event.pop(key, None)
    elif isinstance(value, float) and key in ("ts", "dur") and isinstance(event.get(key), (int, float)):
        event[key] = event[key] + value  # a nearby time: slices that overlap, reorder, leave their step
    else:
        event[key] = value


def _write(directory: Path, traces: dict, config: dict | None) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    directory.mkdir()
    for name, trace in traces.items():
        (directory / name).write_text(json.dumps(trace))
    if config is not None:
        (directory / "run.json").write_text(json.dumps(config))


def analysed_or_refused(directory: Path) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            analyze_dir(directory)
        except InputError as error:
            assert "\n" not in str(error), str(error)
            assert not (directory / "analysis").exists()  # nothing half-written
            return
    summary = json.loads((directory / "analysis" / "summary.json").read_text())
    step = summary["step_time_ms"]
    assert math.isfinite(step) and step > 0, summary
    for rank in summary["ranks"]:
        total = sum(rank[part] or 0.0 for part in PARTS)
        assert math.isclose(total, step, rel_tol=1e-6, abs_tol=1e-6), (rank, step)


@FUZZ
@given(
    seed=st.sampled_from(SEEDS),
    edits=st.lists(st.tuples(st.floats(0, 1), EVENT_EDITS), min_size=1, max_size=6),
)
def test_fuzz_event_edits(tmp_path, seed, edits):
    traces, config = copy.deepcopy(seed)
    names = sorted(traces)
    for which_file, (which_event, key, value) in edits:
        events = _events(traces[_pick(names, which_file)])
        event = _pick(events, which_event) if events else None
        if isinstance(event, dict):
            _edit_event(event, key, value)
    _write(tmp_path / "run", traces, config)
    analysed_or_refused(tmp_path / "run")


RUN_EDITS = st.one_of(
    st.tuples(st.just("drop file"), st.floats(0, 1)),
    st.tuples(st.just("copy file"), st.floats(0, 1)),
    st.tuples(st.just("double events"), st.floats(0, 1)),
    st.tuples(st.just("reverse events"), st.floats(0, 1)),
    st.tuples(st.just("drop events"), st.floats(0, 1), st.text("PPrfilSteRCVDN:#0123456789", max_size=4)),
    st.tuples(
        st.just("header"),
        st.floats(0, 1),
        st.sampled_from(["distributedInfo", "baseTimeNanoseconds", "run_id"]),
        JSON_VALUES | st.just(...),
    ),
    st.tuples(
        st.just("run.json"),
        RUN_KEYS,
        JSON_VALUES
        | st.sampled_from(["gpipe", "1f1b", "interleaved", "zb"])
        | st.integers(0, 9)
        | st.just(...),
    ),
)


def _edit_run(traces: dict, config: dict | None, edit: tuple) -> dict | None:
    """One run-level change (in place on traces; returns the possibly edited run.json)."""
    what, *args = edit
    names = sorted(traces)
    if what == "run.json":
        key, value = args
        if config is not None:
            config = {k: v for k, v in (config | {key: value}).items() if v is not ...}
        return config
    if not names:
        return config
    name = _pick(names, args[0])
    events = _events(traces[name])
    if what == "drop file":
        del traces[name]
    elif what == "copy file":
        traces[f"copy_{name}"] = copy.deepcopy(traces[name])
    elif what == "double events":
        events.extend(copy.deepcopy(events))
    elif what == "reverse events":
        events.reverse()
    elif what == "drop events":
        events[:] = [
            e for e in events if not (isinstance(e, dict) and str(e.get("name", "")).startswith(args[1]))
        ]
    elif what == "header" and isinstance(traces[name], dict):
        key, value = args[1:]
        traces[name].pop(key, None) if value is ... else traces[name].update({key: value})
    return config


@FUZZ
@given(seed=st.sampled_from(SEEDS), edits=st.lists(RUN_EDITS, min_size=1, max_size=4))
def test_fuzz_run_directory_edits(tmp_path, seed, edits):
    traces, config = copy.deepcopy(seed)
    for edit in edits:
        config = _edit_run(traces, config, edit)
    _write(tmp_path / "run", traces, config)
    analysed_or_refused(tmp_path / "run")


def test_every_seed_analyses_or_is_refused_in_one_line(tmp_path):
    """The unmutated seeds: the synthetic ones must analyse (else the fuzz tests nothing past refusal),
    the real ones are refused for the reasons listed above."""
    for number, (traces, config) in enumerate(SEEDS):
        _write(tmp_path / f"seed{number}", traces, config)
        analysed_or_refused(tmp_path / f"seed{number}")
    assert all((tmp_path / f"seed{n}" / "analysis" / "summary.json").exists() for n in range(4))
    for folder, reason in REAL_SEEDS_REFUSED.items():
        directory = tmp_path / folder.replace("/", "_")
        _write(directory, *_real(folder))
        with pytest.raises(InputError, match=re.escape(reason)):
            analyze_dir(directory)
