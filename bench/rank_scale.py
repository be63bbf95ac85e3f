"""Jobs of hundreds of ranks: synthetic PP x DP jobs (p x dp ranks, synthetic.data_parallel) analysed end to
end in fresh processes (`python -m bench.child analyze`) by each engine: `--jobs 1`, `--jobs` of one
process per core, and `--cluster local:N`. Per job and engine: the work's seconds per rank, the driver's
peak RSS above its imports per rank (a cluster's workers are processes of their own), its CPU time per
rank (the cross-rank step, and with `--jobs 1` the ranks' reading too: steadier than wall time on a
loaded machine), and whether every
file the analysis wrote is byte for byte the one `--jobs 1` wrote. Then the job's run page: its build time,
sizes and load time in a browser (bench.report_page)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path

from bench.process import run_child
from bench.report_page import report_page
from runners.schedules import build
from synthetic.data_parallel import write_job

P, M = 8, 16
SLOW_FACTOR, SYNC_US = 1.2, 500.0
TIMEOUT_S = 1200.0


ALONE = "jobs 1"


def engines(cluster_workers: int) -> dict[str, list[str]]:
    """engine name -> the child's flags; the reference first."""
    local = f"local:{cluster_workers}"
    return {ALONE: ["--jobs", "1"], "jobs (cores)": [], local: ["--cluster", local]}


def _written(directory: Path) -> str:
    """One digest of every file under DIR/analysis (names and bytes)."""
    digest = hashlib.sha256()
    for path in sorted((directory / "analysis").iterdir()):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def rank_scale(
    workdir: Path, dps: tuple[int, ...], cluster_workers: int, repo: Path, say: Callable[[str], None]
) -> list[dict]:
    jobs = []
    for dp in dps:
        directory = workdir / f"ranks-{P * dp}" / f"ranks-p{P}-dp{dp}"  # alone in its folder, for the report
        write_job(
            directory,
            build("1f1b", P, M),
            dp,
            slow_pipeline=dp // 2,
            slow_factor=SLOW_FACTOR,
            sync_us=SYNC_US,
            shape="gpu",
            p2p_latency_us=50,
            launch_gap_us=10,
        )
        ranks = P * dp
        job = {"ranks": ranks, "p": P, "dp": dp, "m": M, "engines": {}}
        reference = None
        for name, flags in engines(cluster_workers).items():
            say(f"ranks: {ranks} ranks (p={P} x dp={dp}), {name}")
            run = run_child("analyze", [str(directory), *flags], TIMEOUT_S, repo)
            entry = {"run": run.to_json()}
            if run.status == "ok":
                written = _written(directory)
                reference = written if name == ALONE else reference
                entry |= {
                    "work_s_per_rank": run.work_s / ranks,
                    "driver_cpu_s_per_rank": run.work_cpu_s / ranks,
                    "rss_above_imports_mib_per_rank": (run.peak_rss_mb - run.started_rss_mb) / ranks,
                    "same_as_jobs_1": None if reference is None else written == reference,
                }
            job["engines"][name] = entry
        say(f"ranks: {ranks} ranks, the report's run page")
        job["report"] = report_page(directory, workdir)
        jobs.append(job)
    return jobs
