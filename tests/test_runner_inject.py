"""INJECT: delays injected on purpose are parsed, refused in one line before any process starts when
they cannot be honoured, passed to the workers and recorded in run.json (the real runs are in
test_runner_measured_runs.py)."""

from __future__ import annotations

import argparse
import subprocess

import pytest
from conftest import REPO, trace_command

from runners.inject import Injection, as_text, host_stall_ms, layer_factors, parse_injections
from runners.launch import torchrun_command
from runners.request import RequestError, RunRequest, add_request_arguments, request_from, resolve


def no_gpus() -> int:
    return 0


def test_injections_parse_in_order_and_print_back():
    injections = parse_injections(" host:0:20, slow:1:3,host:1:0.5 ")
    assert injections == (Injection("host", 0, 20.0), Injection("slow", 1, 3.0), Injection("host", 1, 0.5))
    assert as_text(injections) == "host:0:20,slow:1:3,host:1:0.5"
    assert parse_injections(as_text(injections)) == injections
    assert [i.as_json() for i in injections] == [
        {"kind": "host", "rank": 0, "ms": 20.0},
        {"kind": "slow", "stage": 1, "factor": 3},
        {"kind": "host", "rank": 1, "ms": 0.5},
    ]
    assert host_stall_ms(injections, 0) == 20.0 and host_stall_ms(injections, 2) == 0
    assert layer_factors(injections) == {1: 3}
    assert parse_injections(None) == parse_injections("") == ()


@pytest.mark.parametrize(
    "text,words",
    [
        ("host:0", "write host:RANK:MS"),
        ("sleep:0:20", "write host:RANK:MS"),
        ("host:a:20", "not a whole number: 'a'"),
        ("host:-1:20", "not a whole number: '-1'"),
        ("host:0:0", "ms > 0"),
        ("host:0:nan", "not a number written in decimals: 'nan'"),
        ("host:0:1e3", "not a number written in decimals: '1e3'"),
        ("slow:1:1.5", "whole number >= 1"),
        ("slow:1:0", "whole number >= 1"),
        ("host:0:5,host:0:10", "given twice for rank 0"),
        ("host:0:20,", "write host:RANK:MS"),
    ],
)
def test_bad_injections_are_refused_in_one_line(text, words):
    parser = argparse.ArgumentParser()
    add_request_arguments(parser)
    args = parser.parse_args(["--sched", "gpipe", "--m", "4", "--inject", text])
    with pytest.raises(RequestError) as error:
        request_from(args, 2)
    assert words in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize(
    "request_, words",
    [
        (
            RunRequest("gpipe", 2, 4, injections=(Injection("host", 2, 20.0),)),
            "rank 2 does not exist with p=2",
        ),
        (RunRequest("gpipe", 2, 4, injections=(Injection("slow", 2, 3.0),)), "stage 2 does not exist"),
        (RunRequest("zbv", 2, 4, engine="torch", injections=(Injection("slow", 4, 2.0),)), "4 stages, 0..3"),
    ],
)
def test_injections_must_name_a_rank_or_stage_of_the_run(request_, words):
    with pytest.raises(RequestError) as error:
        resolve(request_, no_gpus)
    assert words in str(error.value) and "\n" not in str(error.value)


def test_a_v_placement_may_slow_any_of_its_stages():
    request = RunRequest("interleaved", 2, 4, v=2, injections=(Injection("slow", 3, 2.0),))
    assert resolve(request, no_gpus).request.injections == request.injections


def test_the_workers_get_the_same_injections(tmp_path):
    injections = parse_injections("host:1:7.5,slow:0:2")
    resolved = resolve(RunRequest("gpipe", 2, 4, preset="tiny", device="cpu", injections=injections), no_gpus)
    command = torchrun_command(resolved, tmp_path)
    assert command[command.index("--inject") + 1] == "host:1:7.5,slow:0:2"
    assert "--inject" not in torchrun_command(resolve(RunRequest("gpipe", 2, 4), no_gpus), tmp_path)


@pytest.mark.parametrize("command", ["trace", "sweep"])
def test_the_cli_refuses_a_bad_injection_before_any_process_starts(tmp_path, command):
    traces = tmp_path / "traces"
    counts = ["--m", "4"] if command == "trace" else ["--ms", "2 4"]
    argv = trace_command(traces, "--sched", "gpipe", "--p", "2", *counts, "--inject", "host:3:20")
    argv[argv.index("trace")] = command
    result = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "rank 3 does not exist with p=2" in result.stderr
    assert not traces.exists()
