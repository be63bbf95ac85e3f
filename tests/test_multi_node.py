"""The guide's multi-node command (docs/guide.md, "Several nodes"), run as it prints it on two torchrun
agents of this machine (two "nodes" meeting at a local endpoint): each agent exits 0 and the run directory
both write analyses."""

from __future__ import annotations

import json
import re
import shlex
import socket
import subprocess
import sys
import time

import pytest
from conftest import REPO

from analysis.cli import main as analysis_main

pytestmark = pytest.mark.slow
# Kept small here: one rank per node (the guide's 4 would put 8 ranks on this machine's cores) and the
# tiny preset's seconds-long steps.
SMALL = "--preset tiny --device cpu --steps 1 --timed-steps 1"
AGENT_SECONDS = 300


def guide_command() -> str:
    (command,) = re.findall(r"`(torchrun --nnodes=2 [^`]*)`", (REPO / "docs" / "guide.md").read_text())
    return command


def all_done_or_one_failed(agents: list[subprocess.Popen]) -> bool:
    codes = [agent.poll() for agent in agents]
    return None not in codes or any(code not in (None, 0) for code in codes)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_the_guides_multi_node_command_runs_on_two_agents_and_analyses(tmp_path):
    command = guide_command()
    for placeholder in ("HOST:PORT", "--nproc_per_node=4", "traces/RUN"):
        assert placeholder in command, placeholder
    run = tmp_path / "traces" / "RUN"
    local = (
        command.replace("HOST:PORT", f"127.0.0.1:{free_port()}")
        .replace("--nproc_per_node=4", "--nproc_per_node=1")
        .replace("traces/RUN", str(run))
    )
    argv = [sys.executable, "-m", "torch.distributed.run", *shlex.split(local)[1:], *SMALL.split()]
    logs = [tmp_path / f"agent{i}.log" for i in range(2)]
    agents = [
        subprocess.Popen(argv, cwd=tmp_path, stdout=log.open("wb"), stderr=subprocess.STDOUT) for log in logs
    ]
    try:  # until both are done or one has failed: its partner would wait for it to the rendezvous timeout
        deadline = time.monotonic() + AGENT_SECONDS
        while time.monotonic() < deadline and not all_done_or_one_failed(agents):
            time.sleep(0.2)
    finally:
        for agent in agents:
            agent.kill()
            agent.wait()
    tails = [log.read_text(errors="replace")[-2000:] for log in logs]
    assert [agent.returncode for agent in agents] == [0, 0], tails
    config = json.loads((run / "run.json").read_text())
    assert (config["complete"], config["nodes"], config["world_size"]) == (True, 2, 2)
    assert analysis_main(["analyze", str(run)]) == 0
    summary = json.loads((run / "analysis" / "summary.json").read_text())
    assert (summary["schedule"], summary["p"], summary["m"]) == ("1f1b", 2, 16)
