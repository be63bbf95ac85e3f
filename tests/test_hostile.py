"""Hostile and odd input through the commands: bounded memory (limits checked before the work, named with
their flag), no escaping exception (recursion, overflow), one-line messages that untrusted text cannot
break, no silent wrong answer (steps paired by time, duplicate keys, invalid UTF-8), and the Chrome trace
format in full (B/E pairs, other tools' file names, other JSON files beside the traces).

Each case starts from a good synthetic run (test_faults.good_run) and goes through `main([...])`, as a
user would; docs/ERRORS.md lists each class with its test here.
"""

from __future__ import annotations

import dataclasses
import decimal
import gzip
import json
import zlib
from pathlib import Path

import pytest
from test_faults import cli, document, event, good_run, rewrite

from analysis.errors import InputError, printable
from analysis.merge.perfetto_check import problems
from analysis.traces import limits
from analysis.traces.load import read_trace
from runners.schedules import build
from synthetic.generate import write_run

COMMANDS = ["analyze", "merge"]


def one_error_line(err: str) -> str:
    """The one line of an exit-2 refusal: `error: ...`, nothing else, no control character."""
    assert err.count("\n") == 1 and err.startswith("error: "), err
    assert printable(err[:-1]) == err[:-1], err
    return err


def summary(run: Path) -> dict:
    return json.loads((run / "analysis" / "summary.json").read_text())


def merged(run: Path) -> dict:
    """merged.json.gz decoded strictly: UTF-8 and JSON, or the test fails."""
    return json.loads(gzip.decompress((run / "merged.json.gz").read_bytes()).decode("utf-8"))


def write_gz(path: Path, text: bytes) -> None:
    path.write_bytes(gzip.compress(text))


# 1. Memory: every size is bounded before the work it would cost starts.


@pytest.mark.parametrize("command", COMMANDS)
def test_a_small_gzip_that_expands_past_the_limit_is_refused_while_streaming(tmp_path, capsys, command):
    run = good_run(tmp_path / "run")
    deflate = zlib.compressobj(9, zlib.DEFLATED, 31)
    body = b"".join(
        [deflate.compress(b'{"traceEvents": [')]
        + [deflate.compress(b" " * (1 << 20)) for _ in range(3)]  # 3 MB of blanks in ~3 kB
        + [deflate.compress(b"]}"), deflate.flush()]
    )
    assert len(body) < 20_000
    (run / "rank0.json.gz").write_bytes(body)
    code, err = cli(capsys, command, str(run), "--max-file-mb", "2")
    assert code == 2
    assert one_error_line(err) == (
        f"error: {run / 'rank0.json.gz'}: this file decompresses to more than the limit of 2 MB "
        "(raise it with --max-file-mb)\n"
    )
    cli(capsys, command, str(run), "--max-file-mb", "4")  # within it: an empty trace, whatever follows
    assert "more than the limit" not in capsys.readouterr().err


@pytest.mark.parametrize("command", COMMANDS)
def test_a_huge_sparse_file_is_refused_before_it_is_read(tmp_path, capsys, command):
    run = good_run(tmp_path / "run")
    (run / "rank0.json.gz").unlink()
    most = limits.Limits().file_mb  # the default, from this machine's memory
    with open(run / "rank0.json", "wb") as file:
        file.truncate(10 * most * limits.MB)  # no blocks on disk
    code, err = cli(capsys, command, str(run))
    assert code == 2
    assert one_error_line(err) == (
        f"error: {run / 'rank0.json'}: this file is {10 * most:,} MB of JSON, more than the limit of "
        f"{most:,} MB (raise it with --max-file-mb)\n"
    )


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    "change, problem",
    [
        (
            lambda t: t["distributedInfo"].update(world_size=10**12),
            "world size 1000000000000 (distributedInfo.world_size), more than the limit of 1,024 ranks "
            "(raise it with --max-ranks)",
        ),
        (
            lambda t: t["distributedInfo"].update(rank=2**64 + 1, world_size=None),
            "rank 18446744073709551617 (distributedInfo.rank) is past the limit of 1,024 ranks "
            "(raise it with --max-ranks)",
        ),
        (lambda t: t["distributedInfo"].update(rank=-1), "rank -1 (distributedInfo.rank) is negative"),
        (
            lambda t: t["distributedInfo"].update(world_size=0),
            "distributedInfo.world_size is 0, not a number of ranks",
        ),
        (
            lambda t: t["distributedInfo"].update(rank=5),
            "rank 5 (distributedInfo.rank) is outside its world size of 2",
        ),
    ],
    ids=["absurd world_size", "rank past 64 bits", "negative rank", "world_size 0", "rank past world_size"],
)
def test_rank_numbers_are_range_checked_before_anything_is_sized_by_them(
    tmp_path, capsys, command, change, problem
):
    run = good_run(tmp_path / "run")
    rewrite(run, change)
    code, err = cli(capsys, command, str(run))
    assert code == 2 and one_error_line(err) == f"error: {run / 'rank0.json.gz'}: {problem}\n"


def test_a_rank_number_of_hundreds_of_digits_in_a_file_name_is_refused(tmp_path, capsys):
    run = good_run(tmp_path / "run")
    rewrite(run, lambda t: t.pop("distributedInfo"), rank=1)  # the rank comes from the name
    (run / "rank1.json.gz").rename(run / f"rank{'9' * 200}.json.gz")
    code, err = cli(capsys, "analyze", str(run))
    assert code == 2 and "is past the limit of 1,024 ranks (raise it with --max-ranks)" in one_error_line(err)


def test_a_huge_step_range_is_refused_before_it_is_listed(tmp_path, capsys):
    run = good_run(tmp_path / "run")
    code, err = cli(capsys, "merge", str(run), "--steps", "0-2000000000")
    assert code == 2
    assert one_error_line(err) == (
        "error: --steps: names 2,000,000,001 steps, more than the limit of 100,000 steps "
        "(raise it with --max-steps)\n"
    )
    code, err = cli(capsys, "merge", str(run), "--ranks", "0-99999")
    assert code == 2 and "error: --ranks: names 100,000 ranks, more than the limit of 1,024" in err
    assert cli(capsys, "merge", str(run), "--steps", "0-99999")[0] == 0  # within it: merged


def test_predicting_past_the_microbatch_limit_is_refused_before_any_replay(tmp_path, capsys):
    """predict replays each m: --ms 1000000000 filled 24 GB before the machine killed it."""
    run = good_run(tmp_path / "run")
    code, err = cli(capsys, "predict", str(run), "--ms", "2,1000000000")
    assert code == 2 and one_error_line(err) == (
        "error: --ms: m=1,000,000,000 is past the limit of 10,000 microbatches "
        "(raise it with --max-microbatches)\n"
    )
    assert not (run / "predict.json").exists()
    assert cli(capsys, "predict", str(run), "--ms", "2,100", "--max-microbatches", "100")[0] == 0


def test_advising_past_the_stage_limit_is_refused_before_any_schedule_is_built(tmp_path, capsys):
    """advise builds each v's schedules: --vs 100000000 ran for minutes."""
    run = good_run(tmp_path / "run")
    code, err = cli(capsys, "advise", str(run), "--vs", "1,100000000")
    assert code == 2 and one_error_line(err) == (
        "error: --vs: v=100,000,000 is past the limit of 256 stages (raise it with --max-stages)\n"
    )
    assert not (run / "advice.json").exists()


@pytest.mark.parametrize("command", COMMANDS)
def test_events_and_run_totals_past_their_limits_are_refused_naming_the_flag(tmp_path, capsys, command):
    run = good_run(tmp_path / "run")
    events = len(document(run)["traceEvents"])
    code, err = cli(capsys, command, str(run), "--max-events", str(events - 1))
    assert code == 2 and one_error_line(err) == (
        f"error: {run / 'rank0.json.gz'}: this file holds more than the limit of {events - 1:,} events "
        "(raise it with --max-events)\n"
    )
    code, err = cli(capsys, command, str(run), "--max-run-events", str(events + 1))
    assert code == 2 and one_error_line(err).startswith(
        f"error: {run / 'rank1.json.gz'}: with the files before"
    )
    assert "(raise it with --max-run-events)" in err
    assert cli(capsys, command, str(run), "--max-events", str(events))[0] == 0
    capsys.readouterr()
    for rank in (0, 1):  # 1.2 MB each: within 2 MB a file, past 2 MB together
        rewrite(run, lambda t: event(t, "aten::gelu").update(args={"pad": "x" * 1_200_000}), rank=rank)
    code, err = cli(capsys, command, str(run), "--max-run-mb", "2")
    assert code == 2 and one_error_line(err) == (
        f"error: {run / 'rank1.json.gz'}: with the files before it, the run's JSON comes to more than the "
        "limit of 2 MB (raise it with --max-run-mb)\n"
    )


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    "label, problem",
    [
        (
            "PP:0F99999999999999999999",
            "label 'PP:0F99999999999999999999': microbatch 99999999999999999999 is past the limit of 10,000 "
            "microbatches (raise it with --max-microbatches)",
        ),
        (
            "PP:99999999999999999999F1",
            "label 'PP:99999999999999999999F1': stage 99999999999999999999 is past the limit of 256 stages "
            "(raise it with --max-stages)",
        ),
        (
            "Forward 99999999999999999999",
            "label 'Forward 99999999999999999999': microbatch 99999999999999999999 is past the limit of "
            "10,000 microbatches (raise it with --max-microbatches)",
        ),
        (
            "PP:(0F1;9999999999999999999999B0)OVERLAP_F_B",
            "label 'PP:(0F1;9999999999999999999999B0)OVERLAP_F_B': stage 9999999999999999999999 is past",
        ),
        (
            "ProfilerStep#99999999999999999999",
            "label 'ProfilerStep#99999999999999999999': step number out of range (more than 18 digits)",
        ),
    ],
)
def test_numbers_in_labels_past_64_bits_or_the_limits_are_refused_naming_the_label(
    tmp_path, capsys, command, label, problem
):
    """They used to reach polars' Int64 columns (an overflow traceback) or size a schedule."""
    run = good_run(tmp_path / "run")
    rewrite(run, lambda t: event(t, "PP:0F1").update(name=label))
    code, err = cli(capsys, command, str(run))
    assert code == 2 and one_error_line(err).startswith(f"error: {run / 'rank0.json.gz'}: {problem}")


def test_a_microbatch_within_a_raised_limit_gets_past_the_loader(tmp_path, capsys):
    run = good_run(tmp_path / "run")
    rewrite(run, lambda t: event(t, "PP:0F1").update(name="PP:0F20000"))
    code, err = cli(capsys, "analyze", str(run), "--max-microbatches", "30000")
    assert code == 2 and "--max-" not in err and "5 microbatches" in one_error_line(err)  # the analysis's own


# 2. Recursion: nesting past the decoder's recursion limit, wherever it is.


def deep(levels: int) -> str:
    return "[" * levels + "]" * levels


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("where", ["args of an event", "an unknown top-level key", "traceEvents itself"])
def test_nesting_past_the_recursion_limit_is_one_line(tmp_path, capsys, command, where):
    run = good_run(tmp_path / "run")
    text = json.dumps(document(run))
    nested = deep(100_000)
    if where == "args of an event":
        text = text.replace(
            '"traceEvents": [', '"traceEvents": [{"ph": "i", "ts": 1, "args": {"a": ' + nested + "}}, ", 1
        )
    elif where == "an unknown top-level key":
        text = text[:-1] + ', "extra": ' + nested + "}"
    else:
        text = text.replace('"traceEvents": [', '"traceEvents": [' + nested + ", ", 1)
    write_gz(run / "rank0.json.gz", text.encode())
    code, err = cli(capsys, command, str(run))
    assert code == 2 and one_error_line(err) == (
        f"error: {run / 'rank0.json.gz'}: JSON nested too deeply (past the decoder's recursion limit of "
        "about 1000 levels)\n"
    )


def test_nesting_in_run_json_is_one_line(tmp_path, capsys):
    run = good_run(tmp_path / "run")
    (run / "run.json").write_text('{"complete": true, "x": ' + deep(100_000) + "}")
    code, err = cli(capsys, "analyze", str(run))
    assert code == 2 and "unreadable run.json: JSON nested too deeply" in one_error_line(err)


# 4. Untrusted text in the one line: escaped, never a second line.


@pytest.mark.parametrize("command", COMMANDS)
def test_a_newline_in_a_label_cannot_forge_a_second_error_line(tmp_path, capsys, command):
    run = good_run(tmp_path / "run")
    rewrite(run, lambda t: event(t, "PP:0F1").update(name="PP:0F1\nerror: all is well\u202e"))
    code, err = cli(capsys, command, str(run))
    if command == "analyze":
        assert code == 2 and "PP:0F1\\nerror: all is well\\u202e" in one_error_line(err)
    else:  # the merge draws what it cannot analyse, and says why in one note
        assert code == 0 and err.count("\n") == 2 and "PP:0F1\\nerror: all is well" in err
        assert all(line.startswith("note: ") for line in err.splitlines())


def test_a_newline_in_a_file_name_is_escaped_in_errors_and_warnings(tmp_path, capsys):
    run = good_run(tmp_path / "run")
    forged = run / "rank0\nerror: forged\r.json.gz"
    (run / "rank0.json.gz").rename(forged)
    rewrite_path = forged.read_bytes()
    trace = json.loads(gzip.decompress(rewrite_path))
    event(trace, "aten::gelu").update(dur=-5)  # one warning line naming the file
    write_gz(forged, json.dumps(trace).encode())
    code, err = cli(capsys, "analyze", str(run))
    assert code == 0 and err.count("\n") == 1
    assert (
        err == f"warning: {run}/rank0\\nerror: forged\\r.json.gz: dropped 1 events with a negative duration\n"
    )
    write_gz(forged, b"{")
    code, err = cli(capsys, "analyze", str(run))
    assert code == 2 and one_error_line(err).startswith(f"error: {run}/rank0\\nerror: forged\\r.json.gz: ")


@pytest.mark.parametrize("command", COMMANDS)
def test_a_run_refused_after_a_warning_prints_its_one_error_line_alone(tmp_path, capsys, command):
    """Found by test_fuzz_commands: a warning about rank 0 and then rank 1's refusal were two lines."""
    run = good_run(tmp_path / "run")
    rewrite(run, lambda t: event(t, "aten::gelu").update(dur=-5))
    write_gz(run / "rank1.json.gz", b'{"traceEvents": 3}')
    code, err = cli(capsys, command, str(run))
    assert code == 2 and one_error_line(err).startswith(f"error: {run / 'rank1.json.gz'}: bad trace event")


def test_printable_escapes_control_format_and_surrogate_characters():
    assert (
        printable("a\nb\tc\x00\x1b[31m\u2028\u202e\udc80 ok ☃")
        == "a\\nb\\tc\\x00\\x1b[31m\\u2028\\u202e\\udc80 ok ☃"
    )
    error = InputError(Path("x\ny"), "bad\rthing")
    assert str(error) == "x\\ny: bad\\rthing" and error.problem == "bad\\rthing"


# 5. Silent wrong answers.


def renumber_steps(trace: dict, by: int) -> None:
    for e in trace["traceEvents"]:
        if str(e.get("name", "")).startswith("ProfilerStep#"):
            e["name"] = f"ProfilerStep#{int(e['name'].split('#')[1]) + by}"


def shaped_run(directory: Path, shape: str) -> Path:
    write_run(directory, build("1f1b", 2, 4), steps=2, run_id=directory.name, shape=shape)
    (directory / "truth.json").unlink()
    return directory


@pytest.mark.parametrize("shape", ["cpu", "gpu"])
def test_steps_numbered_apart_are_paired_by_time_and_said_in_one_warning(tmp_path, capsys, shape):
    """Rank 1's profiler started a step later: its #0 ran with rank 0's #1. Pairing by number compared
    different steps (exit 0, a shorter step); paired by time, the figures are the untouched run's."""
    truth_run = shaped_run(tmp_path / "truth", shape)
    assert cli(capsys, "analyze", str(truth_run))[0] == 0
    truth = summary(truth_run)
    run = shaped_run(tmp_path / "run", shape)
    rewrite(run, lambda t: renumber_steps(t, 1), rank=1)
    code, err = cli(capsys, "analyze", str(run))
    assert code == 0
    assert err == (
        "warning: rank 1: ProfilerStep numbers disagree with rank 0's for the steps that ran together "
        "(rank 1's #1 ran with rank 0's #0); paired by time and numbered as rank 0's\n"
    )
    found = summary(run)
    assert found["steps_analyzed"] == truth["steps_analyzed"] == 2
    assert found["step_time_ms"] == pytest.approx(truth["step_time_ms"])
    assert found["ranks"] == truth["ranks"]


def test_a_rank_whose_profiler_started_a_step_later_keeps_the_steps_both_saw(tmp_path, capsys):
    run = good_run(tmp_path / "run")

    def later(trace: dict) -> None:  # rank 1 has no record of step 0; what it calls #0 is step 1
        first = next(e for e in trace["traceEvents"] if e.get("name") == "ProfilerStep#0")
        trace["traceEvents"] = [
            e
            for e in trace["traceEvents"]
            if not (e.get("ts", 0) < first["ts"] + first["dur"] and e.get("ph") == "X")
        ]
        renumber_steps(trace, -1)

    rewrite(run, later, rank=1)
    code, err = cli(capsys, "analyze", str(run))
    assert (
        code == 0
        and err.startswith("warning: rank 1: ProfilerStep numbers disagree")
        and err.count("\n") == 1
    )
    assert "(rank 1's #0 ran with rank 0's #1)" in err
    assert summary(run)["steps_analyzed"] == 1 and summary(run)["median_step"] == 1


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("second", ["[]", "5", '{"a": 1}'])
def test_a_duplicated_top_level_key_is_refused_naming_it(tmp_path, capsys, command, second):
    """Analyze blamed missing PP labels and merge kept the second array; now both name the key."""
    run = good_run(tmp_path / "run")
    text = json.dumps(document(run))
    write_gz(run / "rank0.json.gz", (text[:-1] + f', "traceEvents": {second}}}').encode())
    code, err = cli(capsys, command, str(run))
    assert code == 2 and one_error_line(err) == (
        f"error: {run / 'rank0.json.gz'}: the top-level key 'traceEvents' appears twice (JSON readers "
        "disagree on which one counts; a trace has each once)\n"
    )


def test_a_duplicated_header_key_is_refused_too(tmp_path, capsys):
    run = good_run(tmp_path / "run")
    text = json.dumps(document(run))
    write_gz(run / "rank0.json.gz", ('{"distributedInfo": {"rank": 1}, ' + text[1:]).encode())
    code, err = cli(capsys, "analyze", str(run))
    assert code == 2 and "the top-level key 'distributedInfo' appears twice" in one_error_line(err)


def test_invalid_utf8_is_replaced_counted_and_the_merge_stays_json(tmp_path, capsys):
    run = good_run(tmp_path / "run")
    trace = document(run)
    event(trace, "aten::gelu")["args"] = {"note": "QQQ"}
    event(trace, "aten::mm")["name"] = "RRR"
    text = json.dumps(trace).encode().replace(b"QQQ", b"\x80\xff ok").replace(b"RRR", b"mm\xc3(")
    write_gz(run / "rank0.json.gz", text)
    code, err = cli(capsys, "merge", str(run))
    assert code == 0
    warning = [line for line in err.splitlines() if line.startswith("warning:")]
    assert warning == [
        f"warning: {run / 'rank0.json.gz'}: replaced 3 invalid UTF-8 sequence(s) with U+FFFD "
        + warning[0].split("U+FFFD ")[1]
    ]
    events = merged(run)["traceEvents"]
    assert any(e.get("args") == {"note": "\ufffd\ufffd ok"} for e in events)
    assert any(e.get("name") == "mm\ufffd(" for e in events)
    assert summary(run)["steps_analyzed"] == 2


def test_ranks_years_apart_merge_with_exact_times(tmp_path, capsys):
    """Found by test_fuzz_commands: rank 0's baseTimeNanoseconds 53 years before rank 1's (no analysis,
    no collective to align them) put rank 1's times past 2**43 us, where a double rounds to a quarter
    microsecond and slices stopped nesting; such times are written as exact decimals."""
    run = tmp_path / "run"
    write_run(run, build("1f1b", 2, 2), steps=2, p2p_latency_us=20.3, launch_gap_us=5.1)
    rewrite(run, lambda t: t.update(baseTimeNanoseconds=9_007_199_254_740_992))
    (run / "run.json").unlink()
    code, err = cli(capsys, "merge", str(run), "--no-align")
    assert code == 0, err
    text = gzip.decompress((run / "merged.json.gz").read_bytes()).decode()
    trace = json.loads(text, parse_float=decimal.Decimal)
    assert problems(trace) == []
    late = [e for e in trace["traceEvents"] if e.get("pid") == 1 and e.get("ph") == "X"]
    assert late and all(
        e["ts"] > 2**43 and e["ts"] == e["ts"].quantize(decimal.Decimal("0.001")) for e in late
    )


# 6. Valid input the format allows.


def as_begin_end(trace: dict) -> None:
    out = []
    for e in trace["traceEvents"]:
        if e.get("ph") == "X":
            begin = {k: v for k, v in e.items() if k != "dur"} | {"ph": "B"}
            out += [begin, {"ph": "E", "pid": e["pid"], "tid": e["tid"], "ts": e["ts"] + e["dur"]}]
        else:
            out.append(e)
    trace["traceEvents"] = out


def test_begin_end_pairs_are_analysed_and_merged_as_complete_events(tmp_path, capsys):
    truth_run = good_run(tmp_path / "truth")
    assert cli(capsys, "analyze", str(truth_run))[0] == 0
    run = good_run(tmp_path / "run")
    for rank in (0, 1):
        rewrite(run, as_begin_end, rank=rank)
    code, err = cli(capsys, "merge", str(run))
    assert code == 0 and "without the analysis" not in err
    found, truth = summary(run), summary(truth_run)
    assert found["steps_analyzed"] == 2 and found["ranks"] == truth["ranks"]
    assert found["step_time_ms"] == pytest.approx(truth["step_time_ms"])
    trace = merged(run)
    assert problems(trace) == []
    slices = sum(e.get("ph") == "X" for r in (0, 1) for e in document(truth_run, r)["traceEvents"])
    assert sum(e["ph"] == "X" and e.get("cat") not in ("analysis",) for e in trace["traceEvents"]) == slices
    loaded = read_trace(run / "rank0.json.gz")
    assert loaded.paired == loaded.frame.filter(loaded.frame["ph"] == "X").height and loaded.dropped == 0


def test_begin_events_never_ended_are_dropped_with_one_warning(tmp_path, capsys):
    run = good_run(tmp_path / "run")

    def cut(trace: dict) -> None:
        as_begin_end(trace)
        trace["traceEvents"] = trace["traceEvents"] + [
            {"ph": "B", "name": "open", "pid": 1, "tid": 1, "ts": 1}
        ]
        trace["traceEvents"].insert(0, {"ph": "E", "pid": 9, "tid": 9, "ts": 0})

    rewrite(run, cut)
    code, err = cli(capsys, "analyze", str(run))
    assert code == 0 and err == (
        f"warning: {run / 'rank0.json.gz'}: dropped 1 begin (B) event(s) never ended and 1 end (E) "
        "event(s) with nothing open (a trace cut short?)\n"
    )


def test_a_multi_member_gzip_is_one_text(tmp_path, capsys):
    run = good_run(tmp_path / "run")
    assert cli(capsys, "analyze", str(run))[0] == 0
    truth = summary(run)
    text = json.dumps(document(run)).encode()
    half = len(text) // 2
    (run / "rank0.json.gz").write_bytes(gzip.compress(text[:half]) + gzip.compress(text[half:]) + b"\0" * 8)
    assert cli(capsys, "analyze", str(run))[0] == 0 and summary(run)["ranks"] == truth["ranks"]
    (run / "rank0.json.gz").write_bytes(gzip.compress(text) + b"garbage")
    code, err = cli(capsys, "analyze", str(run))
    assert code == 2 and "gzip data corrupted: trailing bytes after the last member" in one_error_line(err)


@pytest.mark.parametrize("command", COMMANDS)
def test_json_that_is_not_a_trace_beside_the_ranks_is_skipped_with_one_warning(tmp_path, capsys, command):
    run = good_run(tmp_path / "run")
    (run / "config.json").write_text('{"lr": 0.1}')
    code, err = cli(capsys, command, str(run))
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert code == 0 and warnings == [
        f"warning: {run / 'config.json'}: skipped: no traceEvents array (not a Chrome trace?), and not named "
        "like a trace"
    ]


@pytest.mark.parametrize(
    "name, content, problem",
    [
        ("extra_trace.json", '{"lr": 0.1}', "no traceEvents array"),  # named like a trace
        ("notes.json", '{"traceEvents": [', "truncated JSON"),  # holds traceEvents
        ("notes.json", '{"traceEvents": 3}', "bad trace event"),
    ],
)
def test_a_broken_file_named_like_a_trace_or_holding_trace_events_is_still_refused(
    tmp_path, capsys, name, content, problem
):
    run = good_run(tmp_path / "run")
    (run / name).write_text(content)
    code, err = cli(capsys, "analyze", str(run))
    assert code == 2 and one_error_line(err).startswith(f"error: {run / name}: ") and problem in err


@pytest.mark.parametrize(
    "names",
    [
        (
            "host_1234.1690000000000.pt.trace.json.gz",
            "host_1235.1690000000001.pt.trace.json.gz",
        ),  # TensorBoard
        ("rank0_trace.json.gz", "rank1_trace.json.gz"),  # torchtitan
    ],
)
def test_the_report_lists_runs_named_as_other_tools_write_them(tmp_path, capsys, names):
    traces = tmp_path / "traces"
    run = good_run(traces / "run")
    (run / "run.json").unlink()  # someone else's traces: only the names say it is a run
    for rank, name in enumerate(names):
        (run / f"rank{rank}.json.gz").rename(run / name)
    code, err = cli(capsys, "report", "--traces", str(traces), "--out", str(tmp_path / "reports"))
    assert code == 0, err
    page = (tmp_path / "reports" / "index.html").read_text()
    assert ">run<" in page or "run.html" in page, page[:2000]
    assert list((tmp_path / "reports" / "runs").glob("run*.html"))


def test_the_report_shows_a_hostile_run_json_as_an_input_error_row(tmp_path, capsys):
    """The report read run.json with Python's json, whole: nesting was a RecursionError row, and a huge
    (sparse) run.json would have been read into memory."""
    traces = tmp_path / "traces"
    nested, huge = good_run(traces / "nested"), good_run(traces / "huge")
    (nested / "run.json").write_text('{"complete": true, "x": ' + deep(100_000) + "}")
    with open(huge / "run.json", "wb") as file:
        file.truncate(20 * 10**9)
    code, err = cli(capsys, "report", "--traces", str(traces), "--out", str(tmp_path / "reports"))
    assert code == 0, err
    index = (tmp_path / "reports" / "index.html").read_text()
    assert 'class="error"' in index and "RecursionError" not in index and "InputError" not in index
    assert (
        "JSON nested too deeply" in index and "is 20,000 MB, more than the 16 MB such a file may be" in index
    )


def test_limits_have_one_flag_each_and_per_file_defaults_that_follow_the_memory():
    defaults = limits.Limits()
    assert defaults.run_mb is None and defaults.run_events is None  # memory follows the largest file
    now = limits.memory_defaults(limits.available_bytes())  # (memory available moves a little since import)
    assert (
        now[0] * 0.9 <= defaults.file_mb <= now[0] * 1.1 and now[1] * 0.9 <= defaults.events <= now[1] * 1.1
    )
    gb = 1000 * limits.MB
    # a machine that holds one 1 GB trace takes 1 GB files, and 5 million events on less
    assert limits.memory_defaults(limits.FOOTPRINT_PER_BYTE * gb)[0] == 1000
    assert limits.memory_defaults(3 * gb // 2)[1] >= 5_000_000
    for available in (None, 10**8, 4 * gb, 10**12):  # and no file within them outgrows it
        file_mb, events = limits.memory_defaults(available)
        room = limits.ASSUMED_AVAILABLE if available is None else available
        assert file_mb * limits.MB * limits.FOOTPRINT_PER_BYTE <= room
        assert events * limits.FOOTPRINT_PER_EVENT <= room
    flags = [f.metadata["flag"] for f in dataclasses.fields(limits.Limits)]
    assert len(set(flags)) == len(flags) == 8


def test_an_address_space_limit_lowers_the_memory_available(monkeypatch):
    monkeypatch.setattr(limits.resource, "getrlimit", lambda _: (10**8, limits.resource.RLIM_INFINITY))
    assert limits.available_bytes() == 10**8


@pytest.mark.parametrize("command", COMMANDS)
def test_a_run_past_one_file_s_limits_in_all_is_taken_by_default(tmp_path, capsys, command):
    run = good_run(tmp_path / "run")
    events = len(document(run)["traceEvents"])
    for rank in (0, 1):  # 1.2 MB each: within 2 MB a file, past 2 MB together
        rewrite(run, lambda t: event(t, "aten::gelu").update(args={"pad": "x" * 1_200_000}), rank=rank)
    code, err = cli(capsys, command, str(run), "--max-file-mb", "2", "--max-events", str(events))
    assert code == 0, err
