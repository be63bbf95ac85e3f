"""Fuzz every command (analyze, merge, report, predict) through the CLI with the hostile classes of input: nesting
past the decoder's recursion limit, numbers past 64 bits and past the limits (in labels, times, ids,
distributedInfo), control and bidi characters in names and file names, B/E duration pairs (some never
ended, some never begun), duplicated top-level keys, invalid UTF-8 bytes, multi-member, padded, trailing
and cut gzip. Each input is a small synthetic run with a handful of such edits.

The property, per command: exit 0 or exit 2, never an exception out of `main`; every stderr line is one
`error:`, `warning:` or `note:` line without a control character, and an exit 2 prints exactly one line,
`error: ...`; analyze's summary closes on its step time; merge's output is strict UTF-8 JSON that
Perfetto shows as written; report builds its index, and a run it could not analyse is an error row
whose reason is an InputError. FUZZ_EXAMPLES // 10 inputs per command (at least 10).
"""

from __future__ import annotations

import contextlib
import copy
import decimal
import gzip
import io
import json
import math
import os
import re
import shutil
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import event as note_event
from hypothesis import strategies as st

from analysis.cli import main
from analysis.errors import printable
from analysis.merge.perfetto_check import problems
from runners.schedules import build
from synthetic.generate import synthesize
from synthetic.truth import ROWS_PER_MICROBATCH, Work, calibration, calibration_by_rows, dims

EXAMPLES = max(10, int(os.environ.get("FUZZ_EXAMPLES", "40")) // 10)
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=EXAMPLES < 100,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
NEST = "__nest_{}__"


def _seed(shape: str) -> tuple[dict[str, dict], dict]:
    schedule = build("1f1b", 2, 2)
    work = Work({"F": 1000.0, "B": 2000.0})
    made = synthesize(schedule, steps=2, shape=shape, p2p_latency_us=20, launch_gap_us=5, run_id=shape)
    config = {
        "schedule": "1f1b",
        "p": 2,
        "m": 2,
        "v": 1,
        "device": "cuda" if shape == "gpu" else "cpu",
        "calibration": calibration(schedule, work),
        "calibration_by_rows": calibration_by_rows(schedule, work),
        "rows_per_microbatch": ROWS_PER_MICROBATCH,
        "dims": dims(schedule),
        "complete": True,
    }
    return {f"rank{rank}.json": trace for rank, trace in made.traces.items()}, config


SEEDS = [_seed("cpu"), _seed("gpu")]
HUGE = st.one_of(
    st.integers(min_value=2**53, max_value=10**40),
    st.integers(min_value=-(10**40), max_value=-(2**53)),
    st.integers(min_value=1000, max_value=10**6),
    st.sampled_from([2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**4000]),
)
UNSAFE_TEXT = st.text(
    alphabet=st.sampled_from(list("ab\n\r\t\x00\x1b\x7f\u2028\u202e\u200b\ufeff ;:#/")),
    min_size=1,
    max_size=8,
)
WHERE = st.floats(0, 1)

# (kind, ...) edits; each applies to the file chosen by its first float
EDITS = st.one_of(
    st.tuples(
        st.just("nest"),
        WHERE,
        WHERE,
        st.integers(1, 3000),
        st.sampled_from(["args", "event", "top", "run.json"]),
    ),
    st.tuples(
        st.just("label number"),
        WHERE,
        WHERE,
        st.sampled_from(
            [
                "PP:{}F0",
                "PP:0F{}",
                "PP:0B{}",
                "Forward {}",
                "Backward {}",
                "ProfilerStep#{}",
                "PP:({}F0;1B0)OVERLAP_F_B",
                "PP:{}UNSHARD",
            ]
        ),
        HUGE,
    ),
    st.tuples(
        st.just("field number"),
        WHERE,
        WHERE,
        st.sampled_from(["ts", "dur", "pid", "tid", "id"]),
        HUGE | st.floats(allow_nan=False, allow_infinity=False),
    ),
    st.tuples(
        st.just("header number"),
        WHERE,
        st.sampled_from(["rank", "world_size", "baseTimeNanoseconds"]),
        HUGE | st.integers(-3, 3),
    ),
    st.tuples(st.just("control name"), WHERE, WHERE, UNSAFE_TEXT),
    st.tuples(st.just("control file name"), WHERE, UNSAFE_TEXT),
    st.tuples(st.just("begin end"), WHERE, st.floats(0, 1), st.booleans(), st.booleans()),
    st.tuples(
        st.just("duplicate key"),
        WHERE,
        st.sampled_from(["traceEvents", "distributedInfo", "baseTimeNanoseconds", "run_id", "schemaVersion"]),
        st.sampled_from(["[]", "5", '{"rank": 0}', '"x"', "null"]),
    ),
    st.tuples(
        st.just("invalid utf-8"),
        WHERE,
        WHERE,
        st.tuples(st.integers(0x80, 0xFF), st.binary(max_size=2)).map(lambda t: bytes([t[0]]) + t[1]),
    ),
    st.tuples(
        st.just("gzip"),
        WHERE,
        st.sampled_from(["members", "padded", "garbage", "cut", "empty member"]),
        WHERE,
    ),
)


def _pick(items: list, where: float):
    return items[min(int(where * len(items)), len(items) - 1)]


def _events(document) -> list:
    return document if isinstance(document, list) else document.get("traceEvents", [])


class Run:
    """A run directory being built: file name -> document, then text-level and byte-level edits."""

    def __init__(self, traces: dict[str, dict], config: dict):
        self.documents = copy.deepcopy(traces)
        self.config = copy.deepcopy(config)
        self.names = {name: name for name in self.documents}  # original -> name on disk
        self.text_edits: dict[str, list] = {name: [] for name in self.documents}
        self.gzip: dict[str, tuple[str, float]] = {}
        self.nests: dict[str, int] = {}

    def edit(self, edit: tuple) -> None:
        kind, where, *rest = edit
        name = _pick(sorted(self.documents), where)
        document = self.documents[name]
        events = [e for e in _events(document) if isinstance(e, dict)]
        if kind == "nest":
            which, depth, place = rest
            marker = NEST.format(len(self.nests))
            self.nests[marker] = depth
            if place == "run.json":
                self.config["extra"] = marker
            elif place == "top" and isinstance(document, dict):
                document["extra"] = marker
            elif place == "event":
                _events(document).insert(int(which * len(_events(document))), marker)
            elif events:
                _pick(events, which)["args"] = {"deep": marker}
        elif kind == "label number" and events:
            which, form, number = rest
            labels = [
                e for e in events if str(e.get("name", "")).startswith(("PP:", "ProfilerStep#"))
            ] or events
            _pick(labels, which)["name"] = form.format(number)
        elif kind == "field number" and events:
            which, key, number = rest
            _pick(events, which)[key] = number
        elif kind == "header number" and isinstance(document, dict):
            key, number = rest
            if key == "baseTimeNanoseconds":
                document[key] = number
            else:
                document.setdefault("distributedInfo", {})[key] = number
        elif kind == "control name" and events:
            which, text = rest
            event = _pick(events, which)
            event["name"] = str(event.get("name", "")) + text
        elif kind == "control file name":
            (text,) = rest
            safe = text.replace("/", "_").replace("\x00", "_")  # no file name holds either
            self.names[name] = self.names[name].removesuffix(".json") + safe + ".json"
        elif kind == "begin end" and events:
            share, drop_end, drop_begin = rest
            _as_begin_end(document, share, drop_end, drop_begin)
        elif kind in ("duplicate key", "invalid utf-8"):
            self.text_edits[name].append(edit)
        elif kind == "gzip":
            self.gzip[name] = tuple(rest)

    def write(self, directory: Path) -> None:
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
        for name, document in self.documents.items():
            text = json.dumps(document)
            for marker, depth in self.nests.items():
                text = text.replace(json.dumps(marker), "[" * depth + "]" * depth)
            data = text.encode()
            for kind, _, *rest in self.text_edits[name]:
                if kind == "duplicate key" and data.endswith(b"}"):
                    key, value = rest
                    data = data[:-1] + f', "{key}": {value}}}'.encode()
                elif kind == "invalid utf-8":
                    at, bad = rest
                    cut = int(at * len(data))
                    data = data[:cut] + bad + data[cut:]
            on_disk = self.names[name]
            if name in self.gzip:
                mode, at = self.gzip[name]
                data, on_disk = _gzipped(data, mode, at), on_disk + ".gz"
            (directory / on_disk).write_bytes(data)
        text = json.dumps(self.config)
        for marker, depth in self.nests.items():
            text = text.replace(json.dumps(marker), "[" * depth + "]" * depth)
        (directory / "run.json").write_text(text)


def _as_begin_end(document, share: float, drop_end: bool, drop_begin: bool) -> None:
    out = []
    complete = [e for e in _events(document) if isinstance(e, dict) and e.get("ph") == "X" and "dur" in e]
    chosen = {id(e) for e in complete[: max(1, int(share * len(complete)))]}
    for event in _events(document):
        if id(event) not in chosen:
            out.append(event)
            continue
        begin = {k: v for k, v in event.items() if k != "dur"} | {"ph": "B"}
        end = {"ph": "E", "pid": event.get("pid"), "tid": event.get("tid")}
        if isinstance(event.get("ts"), (int, float)) and isinstance(event.get("dur"), (int, float)):
            end["ts"] = event["ts"] + event["dur"]
        out += [begin, end]
    if drop_end and out:
        out = [e for e in out if not (isinstance(e, dict) and e.get("ph") == "E")][:-1] + out[-1:]
    if drop_begin:
        out.insert(0, {"ph": "E", "pid": 1, "tid": 1, "ts": 0})
    if isinstance(document, list):
        document[:] = out
    else:
        document["traceEvents"] = out


def _gzipped(data: bytes, mode: str, at: float) -> bytes:
    cut = int(at * len(data))
    if mode == "members":
        return gzip.compress(data[:cut], 1) + gzip.compress(data[cut:], 1)
    if mode == "padded":
        return gzip.compress(data, 1) + b"\0" * (1 + cut % 100)
    if mode == "garbage":
        return gzip.compress(data, 1) + b"trailing"
    if mode == "empty member":
        return gzip.compress(b"") + gzip.compress(data, 1)
    whole = gzip.compress(data, 1)
    return whole[: int(at * len(whole))]


def _run(*argv: str) -> tuple[int, str]:
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        code = main(list(argv))
    return code, err.getvalue()


def _one_line_each(code: int, err: str) -> None:
    assert code in (0, 2), (code, err)
    note_event(f"exit {code}")
    lines = err.splitlines()
    assert err == "" or err.endswith("\n"), err
    for line in lines:
        assert line.startswith(("error: ", "warning: ", "note: ")), line
        assert printable(line) == line, line
    if code == 2:
        assert len(lines) == 1 and lines[0].startswith("error: "), err


def _closes(run: Path) -> None:
    summary = json.loads((run / "analysis" / "summary.json").read_text())
    step = summary["step_time_ms"]
    assert math.isfinite(step) and step > 0, summary
    for rank in summary["ranks"]:
        total = sum(rank.get(part) or 0.0 for part in summary["parts"])
        assert math.isclose(total, step, rel_tol=1e-6, abs_tol=1e-6), (rank, step)


def _mutated(seed, edits) -> Run:
    run = Run(*seed)
    for edit in edits:
        note_event(f"edit: {edit[0]}")
        run.edit(edit)
    return run


def _command_on_mutated(tmp_path: Path, seed, edits, command: str, *options: str) -> tuple[Path, int]:
    """`command` on the mutated run directory (its path first, then `options`), its stderr checked to be
    one-line messages; the directory and the exit code."""
    directory = tmp_path / "run"
    _mutated(seed, edits).write(directory)
    code, err = _run(command, str(directory), *options)
    _one_line_each(code, err)
    return directory, code


@FUZZ
@given(seed=st.sampled_from(SEEDS), edits=st.lists(EDITS, min_size=1, max_size=4))
def test_fuzz_analyze(tmp_path, seed, edits):
    directory, code = _command_on_mutated(tmp_path, seed, edits, "analyze")
    if code == 0:
        _closes(directory)
    else:
        assert not (directory / "analysis").exists()


@FUZZ
@given(seed=st.sampled_from(SEEDS), edits=st.lists(EDITS, min_size=1, max_size=4))
def test_fuzz_merge(tmp_path, seed, edits):
    directory, code = _command_on_mutated(tmp_path, seed, edits, "merge")
    merged = directory / "merged.json.gz"
    if code == 0:
        text = gzip.decompress(merged.read_bytes()).decode("utf-8")  # strict: UTF-8, JSON, exact times
        trace = json.loads(text, parse_float=decimal.Decimal)
        assert problems(trace) == [], problems(trace)
    else:
        assert not merged.exists()


@FUZZ
@given(seed=st.sampled_from(SEEDS), edits=st.lists(EDITS, min_size=1, max_size=4))
def test_fuzz_report(tmp_path, tmp_path_factory, seed, edits):
    traces = tmp_path / "traces"
    shutil.rmtree(traces, ignore_errors=True)
    _mutated(seed, edits).write(traces / "run")
    reports = tmp_path_factory.getbasetemp() / "fuzz-reports"  # one, so the vega bundle is written once
    code, err = _run("report", "--traces", str(traces), "--out", str(reports))
    assert code == 0, err
    _one_line_each(code, err)
    index = (reports / "index.html").read_text()
    pages = list((reports / "runs").glob("run*.html"))
    if not pages:  # not analysed: an error row whose reason is an input error's line; a bug's names its class
        reasons = re.findall(r'<td class="error">(.*?)</td>', index)
        bugs = [reason for reason in reasons if re.match(r"\w+(Error|Exception): ", reason)]
        assert reasons and not bugs, (bugs, index[-3000:])


COUNTS = st.lists(st.integers(1, 64), min_size=1, max_size=4)
MS = COUNTS | st.lists(st.integers(1, 64) | HUGE.filter(lambda n: n > 0), min_size=1, max_size=4)


@FUZZ
@given(seed=st.sampled_from(SEEDS), edits=st.lists(EDITS, max_size=4), ms=MS)
def test_fuzz_predict(tmp_path, seed, edits, ms):
    directory, code = _command_on_mutated(tmp_path, seed, edits, "predict", "--ms", ",".join(map(str, ms)))
    predicted = directory / "predict.json"
    if code == 0:
        found = json.loads(predicted.read_text())
        assert found and all(math.isfinite(p["step_time_ms"]) and p["step_time_ms"] > 0 for p in found)
    else:
        assert not predicted.exists()


def test_every_seed_analyses_merges_and_reports(tmp_path):
    for number, seed in enumerate(SEEDS):
        directory = tmp_path / "traces" / f"seed{number}"
        Run(*seed).write(directory)
        assert _run("analyze", str(directory)) == (0, "")
        _closes(directory)
        code, err = _run("merge", str(directory))
        assert code == 0 and "error" not in err and "warning" not in err
        code, err = _run("predict", str(directory), "--ms", "2,4")
        assert code == 0 and err == "", err
    code, err = _run("report", "--traces", str(tmp_path / "traces"), "--out", str(tmp_path / "reports"))
    assert code == 0 and len(list((tmp_path / "reports" / "runs").glob("seed*.html"))) == 2
