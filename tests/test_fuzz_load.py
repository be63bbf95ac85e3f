"""Fuzz the loader with mutated real and synthetic traces: nothing but InputError may escape.

FUZZ_EXAMPLES sets the number of inputs per mutation kind (small by default; `make fuzz` sets 20000).
"""

from __future__ import annotations

import gzip
import json
import os
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analysis.errors import InputError
from analysis.traces.load import read_trace
from synthetic.generate import synthesize
from runners.schedules import build

REAL = Path(__file__).resolve().parents[1] / ".." / "shared" / "real-traces"
SMALL_REAL = ["hta/cpu_only", "hta/critical_path/cuda_event_sync", "hta/amd_trace", "pippy"]
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "40"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES < 1000,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _seeds() -> list[bytes]:
    documents = [json.dumps(synthesize(build("1f1b", 2, 2), shape=shape, steps=1, p2p_latency_us=3).traces[1]).encode()
                 for shape in ("cpu", "gpu")]
    for folder in SMALL_REAL:
        documents += [gzip.decompress(p.read_bytes()) for p in sorted((REAL / folder).glob("*.json.gz"))]
    return documents


SEEDS = _seeds()
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=5,
)


def only_input_errors(tmp_path: Path, data: bytes, name: str = "rank0.json") -> None:
    path = tmp_path / name
    path.write_bytes(data)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            trace = read_trace(path)
        except InputError as error:
            assert "\n" not in str(error)
            return
    assert trace.frame.height >= 0


@FUZZ
@given(seed=st.sampled_from(SEEDS), flips=st.lists(st.tuples(st.floats(0, 1), st.integers(0, 255)), min_size=1, max_size=8))
def test_byte_flips(tmp_path, seed, flips):
    data = bytearray(seed)
    for where, value in flips:
        data[min(int(where * len(data)), len(data) - 1)] = value
    only_input_errors(tmp_path, bytes(data))


@FUZZ
@given(seed=st.sampled_from(SEEDS), cut=st.floats(0, 1), compress=st.booleans())
def test_truncation(tmp_path, seed, cut, compress):
    data = gzip.compress(seed, 1) if compress else seed
    only_input_errors(tmp_path, data[: int(cut * len(data))], "rank0.json.gz" if compress else "rank0.json")


@FUZZ
@given(seed=st.sampled_from(SEEDS), picks=st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1), JSON_VALUES | st.just(...)),
                                                    min_size=1, max_size=5))
def test_field_deletions_and_type_swaps(tmp_path, seed, picks):
    document = json.loads(seed)
    events = document if isinstance(document, list) else document["traceEvents"]
    for which_event, which_key, value in picks:
        event = events[min(int(which_event * len(events)), len(events) - 1)]
        if not isinstance(event, dict) or not event:
            continue
        keys = sorted(event)
        key = keys[min(int(which_key * len(keys)), len(keys) - 1)]
        if value is ...:
            del event[key]
        else:
            event[key] = value
    only_input_errors(tmp_path, json.dumps(document).encode())


@FUZZ
@given(header=st.dictionaries(st.sampled_from(["distributedInfo", "baseTimeNanoseconds", "deviceProperties", "run_id",
                                               "traceName", "traceEvents"]), JSON_VALUES, max_size=4))
def test_header_type_swaps(tmp_path, header):
    only_input_errors(tmp_path, json.dumps(header).encode())


@pytest.mark.skipif(not (REAL / "pippy").is_dir(), reason="../shared/real-traces is not beside the repository")
def test_seeds_include_real_traces():
    assert len(SEEDS) > 2
