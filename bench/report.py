"""bench/results.json's document -> bench/RESULTS.md: one block per section, each with its verdicts first.

A block is marked (`<!-- bench: NAME -->` ... `<!-- /bench: NAME -->`) and says which command, date and
git revision measured it, so a run of some parts rewrites their blocks and keeps the others' as they
were (bench.suite merges results.json the same way).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from analysis.vocabulary import ASSUMED, RUNGS, Assumption
from bench.stats import Stats
from runners.results import markdown_table

SEED_COLUMNS = ("p", "m", "slot_ms", "step_ms", "bubble_theory", "bubble_measured")
OUR_COLUMNS = ("analysis_bubble", "profiled_step_ms", *(f"{term}_ms" for term in RUNGS))
SWEEP_COLUMNS = (
    "schedule",
    "m",
    "step_ms",
    "step_ms_min",
    "step_ms_max",
    "profiled_step_ms",
    "profiler_ratio",
    "typical_step_ms",
    "typical_error",
)


def _figure(entry: dict, digits: int = 3) -> str:
    return Stats(entry["median"], entry["min"], entry["max"], entry["n"]).text(digits)


def _table(columns: tuple[str, ...], rows: list[dict]) -> list[str]:
    return [*markdown_table(columns, rows).splitlines(), ""]


def _unmeasured(size: dict, ratio: str) -> str:
    """What can still be said when a ratio has no figure: HTA stopped at its cap gives a lower bound."""
    hta, ours = size["tasks"]["hta"], size["tasks"]["analyze"]
    if ratio == "hta_over_ours" and hta["status"] == "timeout" and "wall_s" in ours:
        stopped = hta["runs"][0]["wall_s"]
        return (
            f"> {stopped / ours['wall_s']['median']:.2f} (whole processes: HTA stopped after {stopped:.0f} s, "
            f"ours {ours['wall_s']['median']:.0f} s)"
        )
    return "not measured (see section 1)"


def _verdicts(rows: list[str]) -> list[str]:
    """A section's verdict table (none when it has no rows)."""
    return (
        ["| figure | median (min-max) | target | verdict |", "|---|---|---|---|", *rows, ""] if rows else []
    )


def _throughput_verdicts(part: dict) -> list[str]:
    rows = []
    for size in part["sizes"]:
        where = f"{_set_size(size)}, {size['ranks']} ranks"
        for name, label in (
            ("hta_over_ours", "HTA load time / ours (work after imports)"),
            ("hta_over_ours_wall", "HTA load time / ours (whole processes)"),
            ("ours_over_decode", "ours / typed decoding"),
            ("replay_share", "share of ours in every step's own replay and critical path"),
            ("rss_over_size", "our peak RSS with workers / trace bytes"),
            ("one_process_rss_over_largest_file", "our peak RSS, --jobs 1 / largest trace file"),
            (
                "one_process_rss_above_start_over_largest_file",
                "our peak RSS above the imports', --jobs 1 / largest trace file",
            ),
        ):
            if name in size["ratios"]:
                ratio = size["ratios"][name]
                rows.append(
                    f"| {label} ({where}) | {_figure(ratio, 2)} | {ratio['target']} | {ratio['verdict']} |"
                )
            else:
                rows.append(f"| {label} ({where}) | {_unmeasured(size, name)} | | |")
    growth = part.get("growth") or {}
    for task, g in growth.items():
        if isinstance(g, dict) and "time_per_mb" in g:
            per_mb = g["time_per_mb"]
            label = f"{task}: time per MB, {growth['ratio']:.1f}x the size / the smallest set (linear: 1)"
            rows.append(f"| {label} | {_figure(per_mb, 2)} | {per_mb['target']:.2f} | {per_mb['verdict']} |")
    return _verdicts(rows)


def _executor_verdicts(executor: dict) -> list[str]:
    if not executor["available"]:
        return _verdicts([f"| native / torch step time | {executor['reason']} | 1.0 | |"])
    return _verdicts(
        [
            f"| native / torch, {c['schedule']} m={c['m']} | {c.get('failed') or _figure(c['native_over_torch'])} "
            f"| 1.0 | {c.get('verdict', '')} |"
            for c in executor["configs"]
        ]
    )


def _sweep_verdicts(results: dict) -> list[str]:
    rows = []
    if "profiler" in results:
        profiler = results["profiler"]
        rows.append(
            f"| profiled / unprofiled step (CPU, {profiler['n']} runs) | {_figure(profiler)} | "
            f"{profiler['target']} | {profiler['verdict']} |"
        )
    if "sim" in results:
        sim = results["sim"]
        rows.append(
            f"| abs(typical / measured - 1) ({sim['runs_within']}/{sim['runs']} within target) | "
            f"{_figure(sim)} | {sim['target']} | {sim['verdict']} |"
        )
    return _verdicts(rows)


def _set_size(size: dict) -> str:
    return f"{size['mb']:.0f} MB{' gzipped' if size.get('gzipped') else ''}"


def _throughput(part: dict) -> list[str]:
    sources = ", ".join(f"`{Path(path).name}` ({ranks} ranks)" for ranks, path in part["sources"].items())
    lines = [
        # the runs' names only: their folder is the benchmark's scratch space, gone when it ends
        f"Source runs replicated: {sources}. Times are the work inside a fresh process after its imports "
        "(wall = the whole process); peak RSS is the process's own high-water mark, 'with workers' the "
        "sampled peak of the RSS summed over it and its pool workers (ours and HTA read ranks in a pool), "
        "'largest' the largest sampled RSS of one of those processes; 'procs' the processes each read the "
        "ranks with. analyze_jobs1 is analyze with --jobs 1 (one process, one rank at a time); merge "
        "writes merged.json.gz (rows: its bytes). Typed decoding (decode) is the floor: every file decoded "
        "by msgspec into typed structs of ph, name, cat, ts, dur, pid, tid, id (args raw), over one process per "
        "core as ours; a gzipped file is first inflated whole by the codec the analysis inflates with (isal's, "
        "else zlib), so ours / typed decoding compares like with like. Sizes are the JSON text's, gzipped or "
        "not. Ours and decoding: "
        f"{part['repeats']} alternating repeats; the others once per set, HTA stopped after "
        f"{part['hta_timeout_s']:.0f} s.",
        "",
    ]
    for size in part["sizes"]:
        lines += [
            f"### {_set_size(size)}, {size['ranks']} ranks, {size['steps_per_rank']} steps per rank",
            "",
            "| task | work s | wall s | RSS at start MiB | peak RSS MiB | with workers MiB | largest MiB | procs "
            "| rows | status |",
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for task, figures in size["tasks"].items():
            if figures["status"] == "ok":
                lines.append(
                    f"| {task} | {_figure(figures['work_s'], 2)} | {_figure(figures['wall_s'], 2)} | "
                    f"{_figure(figures['started_rss_mb'], 0)} | {_figure(figures['peak_rss_mb'], 0)} | "
                    f"{_figure(figures['tree_rss_mb'], 0)} | "
                    f"{_figure(figures['largest_rss_mb'], 0)} | {figures['processes']} | {figures['rows']} | ok |"
                )
            else:
                lines.append(
                    f"| {task} | - | - | - | - | {figures['tree_rss_mb_at_stop']:.0f} at stop | - | - | - | "
                    f"{figures['status']}: {figures['detail']} |"
                )
        lines += [
            "",
            *(
                f"- {name}: {_figure(r, 2)} (target {r['target']}: {r['verdict']})"
                for name, r in size["ratios"].items()
            ),
            "",
        ]
    for key in ("growth", "growth_ranks"):
        growth = part.get(key)
        if growth:
            what = (
                "larger set"
                if growth["by"] == "mb"
                else f"more ranks (sets {growth['size_ratio']:.2f}x the size)"
            )
            lines.append(f"Growth over {growth['ratio']:.1f}x {what} (linear = the same factor):")
            lines += [
                f"- {task}: time x{g['time_ratio']:.2f}, peak RSS with workers x{g['rss_ratio']:.2f}"
                for task, g in growth.items()
                if isinstance(g, dict)
            ]
            lines.append("")
    return lines


def _executor(part: dict) -> list[str]:
    if not part["available"]:
        return [part["reason"], ""]
    lines = [
        "| schedule | m | native ms | torch ms | native / torch | verdict |",
        "|---|---|---|---|---|---|",
    ]
    for c in part["configs"]:
        if "failed" in c:
            lines.append(f"| {c['schedule']} | {c['m']} | failed: {c['failed']} | | | |")
        else:
            lines.append(
                f"| {c['schedule']} | {c['m']} | {_figure(c['native_ms'], 1)} | {_figure(c['torch_ms'], 1)} "
                f"| {_figure(c['native_over_torch'])} | {c['verdict']} |"
            )
    return lines + [""]


def _above(shares: list[float], target: float) -> str:
    return f"{sum(abs(share) > target for share in shares)} of {len(shares)}"


def _bubble(part: dict) -> list[str]:
    lines = []
    if "deviation" in part:
        deviation = part["deviation"]
        lines += _verdicts(
            [
                f"| abs(bubble - 0.5), gpipe p=2 m=1 ({deviation['n']} runs) | {_figure(deviation, 4)} | "
                f"{deviation['target']} | {deviation['verdict']} |"
            ]
        )
    if "slowdown" in part:
        slowdown = part["slowdown"]
        lines += _verdicts(
            [
                f"| abs(slowdown / busy), each rank of gpipe p=2 m=1 | {_figure(slowdown)} | "
                f"{slowdown['target']} | {slowdown['verdict']} |"
            ]
            + (
                [
                    f"| abs((slowdown - cpu_contention) / busy), the same ranks | {_figure(beyond)} | "
                    f"{beyond['target']} | {beyond['verdict']} |"
                ]
                if (beyond := part.get("beyond_contention"))
                else []
            )
            + (
                [
                    "| abs(a calibration pass / the other passes' median - 1), the same ranks' rounds "
                    f"(the machine's own noise) | {_figure(noise)} | {noise['target']} | "
                    f"{_above(part['pass_noise_shares'], noise['target'])} above the target |"
                ]
                if (noise := part.get("pass_noise"))
                else []
            )
        )
    if "bubbles" in part:
        lines += [
            f"Bubbles measured ({len(part['bubbles'])} runs): "
            + ", ".join(f"{b:.4f}" for b in part["bubbles"])
            + ".",
            "",
        ]
    if "slowdown_shares" in part:
        lines += [
            "Slowdown / busy per rank (rank 0, rank 1 of each run): "
            + ", ".join(f"{share:+.3f}" for share in part["slowdown_shares"])
            + "; less each rank's cpu_contention: "
            + ", ".join(f"{share:+.3f}" for share in part.get("beyond_contention_shares", []))
            + f". Above the target: {_above(part['slowdown_shares'], part['slowdown']['target'])} ranks.",
            "",
            *_cold(part["cold"]),
        ]
    return lines + [f"Failed: {reason}" for reason in part["failed"]] + [""]


def _cold(cold: dict) -> list[str]:
    """bench/cold.py's table: each condition's pass against the same round's back-to-back one."""
    base = cold["ms"][cold["conditions"][0]]  # back to back, the calibration's way
    lines = [
        f"What the idle before a pass costs it (bench/cold.py: stage 0 of the preset, two gloo ranks, "
        f"{cold['pairs']} rounds, conditions shuffled per round; idle {cold['idle_ms']:.0f} ms; ratios "
        f"to the same round's back-to-back pass; op union is busy time's rule, CPU time leaves out waiting "
        f"for a core). Back to back: F {_figure(base['F'], 1)} ms, "
        f"B {_figure(base['B'], 1)} ms op union.",
        "",
        "| before the pass | F op union | B op union | B CPU time | B's largest excess by operator (ms) |",
        "|---|---|---|---|---|",
    ]
    for condition in cold["conditions"][1:]:
        excess = ", ".join(f"{name} {ms:+.2f}" for name, ms in cold["op_excess_ms"][condition]["B"].items())
        ratios = cold["over_back_to_back"][condition]
        lines.append(
            f"| {condition} | {_figure(ratios['F'])} | {_figure(ratios['B'])} "
            f"| {_figure(cold['cpu_over_back_to_back'][condition]['B'])} | {excess} |"
        )
    return lines + [""]


def _inject(part: dict) -> list[str]:
    lines = []
    for case in part.values():
        if "failed" in case:
            lines += [f"`{case['injection']}`: failed: {case['failed']}", ""]
            continue
        lines += [
            f"`{case['injection']}`, {case['preset']} preset, {case['schedule']} p={case['p']} m={case['m']}, "
            f"{case['pairs']} pairs; injected a step: {_figure(case['injected_ms'], 1)} ms.",
            "",
            "| figure | baseline ms | delta ms | delta / injected | deltas per pair, ms |",
            "|---|---|---|---|---|",
            *(
                f"| {f['figure']} | {_figure(f['baseline_ms'], 1)} | {_figure(f['delta_ms'], 1)} | "
                f"{_figure(f['share'])} | {', '.join(f'{d:.1f}' for d in f['per_pair_ms'])} |"
                for f in case["figures"]
            ),
            "",
        ]
    return [
        "A pair is a run without the injection, then the same run with it; delta = with - without, per pair. "
        "host:R:X sleeps X ms before each of rank R's forwards, m*X a step (injected); launch_overhead and "
        "busy (compute + small_gemm + slowdown) are rank R's, peer_bubble is rank R+1's bubble. "
        "slow:S:K gives stage S K times its layers; injected: (K-1) x the stage's full-batch F+B in the "
        "baseline's calibration; imbalance, small_batches and interference are waterfall terms, slowed_rank_slowdown "
        "and slowed_rank_cpu_contention (its wait for a core) rank S's parts. No verdict here: "
        "the targets live in tests/test_inject_recovery.py, each with the spread measured here.",
        "",
        *lines,
    ]


def _verdict(value: float | None, target: float) -> str:
    return "unmeasured" if value is None else ("meets" if abs(value) <= target else "misses")


def _mib(count: float | None) -> str:
    return "-" if count is None else f"{count / 2**20:.2f}"


def _advice(part: dict) -> list[str]:
    targets, configs = part["targets"], part["configs"]
    rows = [
        f"| abs(predicted / measured step - 1), #{c['rank']} {c['schedule']} m={c['m']} v={c['v']} ({c['engine']}) "
        f"| {'-' if c['step_error'] is None else format(abs(c['step_error']), '.3f')} | {targets['step']} "
        f"| {_verdict(c['step_error'], targets['step'])} |"
        for c in configs
    ]
    rows += [
        f"| abs(predicted / measured peak activations - 1), #{c['rank']} {c['schedule']} m={c['m']} v={c['v']} "
        f"| {'-' if c['peak_error'] is None else format(abs(c['peak_error']), '.3f')} | {targets['memory']} "
        f"| {_verdict(c['peak_error'], targets['memory'])} |"
        for c in configs
    ]
    pick = part["top_pick_over_best"]
    rows.append(
        f"| top pick's measured step / the measured best - 1 | {'-' if pick is None else format(pick, '.3f')} "
        f"| {targets['pick']} | {_verdict(pick, targets['pick'])} |"
    )
    s = part["source"]
    return [
        *_verdicts(rows),
        f"From one {s['engine']} {s['schedule']} p={s['p']} m={s['m']} run with --calibrate-advice "
        f"({s['step_time_ms']:.1f} ms; "
        f"ranked: {part['ranked']}{'; ' + '; '.join(part['run_caveats']) if part['run_caveats'] else ''}), "
        f"`python -m analysis advise RUN`; its top candidates and the starting configuration then ran "
        f"{part['repeats']} times each, alternating. Measured: the median of the profiled steps "
        "(summary.json step_time_ms) and of the largest rank's peak activation bytes.",
        "",
        "| # | engine | schedule | m | v | predicted ms (interval) | measured ms | predicted MiB | measured MiB |",
        "|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {c['rank']} | {c['engine']} | {c['schedule']} | {c['m']} | {c['v']} | {c['predicted_ms']:.1f} "
            f"({c['interval_ms'][0]:.1f}-{c['interval_ms'][1]:.1f}) | "
            f"{'-' if c['measured_ms'] is None else _figure(c['measured_ms'], 1)} | "
            f"{_mib(c['predicted_peak_bytes'])} | "
            f"{_mib(c['measured_peak_bytes'] and c['measured_peak_bytes']['median'])} |"
            for c in configs
        ),
        "",
        *sorted(
            {
                f"Assumed {name}: {ASSUMED[Assumption(name)]}"
                for c in configs
                for name in c.get("assumptions", [])
            }
        ),
        *sorted({f"Assumed: {why}" for c in configs for why in c["caveats"]}),
        "",
        *([*(f"Failed: {reason}" for reason in part["failed"]), ""] if part["failed"] else []),
    ]


def _error(guess: float, truth: float) -> str:
    return f"{guess:.1f} ({guess / truth - 1:+.1%})"


def _foreign(part: dict) -> list[str]:
    synthetic = part["synthetic"]
    runs = [r for r in part["runs"] if not r["same"]]
    own = [r for r in runs if r["own_m"]]
    other = [r for r in runs if not r["own_m"]]
    close = sum(abs(r["alone_ms"] / r["measured_ms"] - 1) <= part["targets"]["own_m"] for r in own)
    held = sum(r["interval_ms"][0] <= r["measured_ms"] <= r["interval_ms"][1] for r in other)
    same_pick = sum(p["calibrated"][:2] == p["alone"][:2] for p in part["picks"])
    rows = [
        f"| own m, other schedule: trace-alone within {part['targets']['own_m']:.0%} of the measured median "
        f"| {close} of {len(own)} | all | {'meets' if own and close == len(own) else 'misses'} |",
        f"| other m: measured median inside the trace-alone interval | {held} of {len(other)} "
        f"| {part['targets']['coverage']:.0%} | "
        f"{'meets' if other and held >= part['targets']['coverage'] * len(other) else 'misses'} |",
        f"| top pick the same as the calibrated advice's | {same_pick} of {len(part['picks'])} | all | "
        f"{'meets' if same_pick == len(part['picks']) else 'misses'} |",
    ]
    return [
        *_verdicts(rows),
        "Synthetic (the generator's step is the truth; slowdown 1.3 in every order; at 2 x m the run.json "
        "keeps only the microbatch's rows, the rest of the rows from the traces alone):",
        "",
        "| shape | p | source | target | generator ms | calibrated ms | trace-alone ms | interval ms | assumes |",
        "|---|---|---|---|---|---|---|---|---|",
        *(
            f"| {r['shape']} | {r['p']} | {r['source']} | {r['target']} | {r['truth_ms']:.2f} "
            f"| {_error(r['calibrated_ms'], r['truth_ms'])} | {_error(r['alone_ms'], r['truth_ms'])} "
            f"| {r['interval_ms'][0]:.1f}-{r['interval_ms'][1]:.1f} | {', '.join(r['assumptions']) or '-'} |"
            for r in synthetic
        ),
        "",
        f"Runs (p=2, CPU, {part['repeats']} repeats of each; measured: the median profiled step): each run "
        "advised from its run directory (calibrated) and from a copy holding its rank traces alone.",
        "",
        "| source | target | measured ms | calibrated ms | trace-alone ms | interval ms | assumes |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {r['source']} | {r['target']} | {r['measured_ms']:.1f} "
            f"| {_error(r['calibrated_ms'], r['measured_ms'])} | {_error(r['alone_ms'], r['measured_ms'])} "
            f"| {r['interval_ms'][0]:.1f}-{r['interval_ms'][1]:.1f} "
            f"| {', '.join(r['assumptions']) or '-'} |"
            for r in runs
        ),
        "",
        "Top picks (schedule, m, ranked), calibrated / trace-alone: "
        + "; ".join(f"{p['source']}: {p['calibrated']} / {p['alone']}" for p in part["picks"])
        + ". 1-minute load average at each repeat's start: "
        + ", ".join(f"{load:.1f}" for load in part["load_average"])
        + ".",
        "",
        *([*(f"Failed: {reason}" for reason in part["failed"]), ""] if part["failed"] else []),
    ]


def _predict(part: dict) -> list[str]:
    configs = part["configs"]
    rows = [
        f"| abs(median predicted / median measured - 1), {c['schedule']} m={c['m']} | {c['median_error']:.3f} | "
        f"{c['error']['target']} | {c['median_verdict']} |"
        for c in configs
    ]
    coverage = part["coverage"]
    share = coverage["held"] / coverage["of"] if coverage["of"] else 0.0
    rows.append(
        f"| intervals holding the measured median | {coverage['held']} of {coverage['of']} ({share:.0%}) | "
        f"{coverage['target']:.0%} | {'meets' if share >= coverage['target'] else 'misses'} |"
    )
    source = ", ".join(f"{s} {_figure(e)}" for s, e in part["source_typical_error"].items())
    return [
        *_verdicts(rows),
        f"Each of {part['repeats']} repeats: one run at m={part['source_m']} per schedule, "
        "`python -m analysis predict RUN --ms ...` from it, then a run at each m; measured is that run's profiled "
        "step (summary.json step_time_ms). The error is the median prediction against the median run; the "
        "interval of each repeat's prediction (step_time_low_ms, step_time_high_ms) holds the median run or not.",
        "",
        "| schedule | m | predicted ms | measured ms | pairwise abs(predicted / measured - 1) | intervals ms "
        "| machine level |",
        "|---|---|---|---|---|---|---|",
        *(
            f"| {c['schedule']} | {c['m']} | {_figure(c['predicted_ms'], 1)} | {_figure(c['measured_ms'], 1)} "
            f"| {_figure(c['error'])} | "
            + ", ".join(f"{low:.1f}-{high:.1f}" for low, high in c["intervals_ms"])
            + f" | {_figure(c['machine_level']) if c.get('machine_level') else '-'} |"
            for c in configs
        ),
        "",
        "Machine level: the target run's isolated calibration over its source run's at the same microbatch sizes "
        "(both time every size one rank at a time), the median over stages, kinds and sizes: how much slower the "
        "machine ran the target than its source, which the prediction cannot know.",
        "",
        f"The m={part['source_m']} runs' own typical step / measured - 1 (the variability and residual, which "
        f"every prediction inherits): {source or 'none'}.",
        "",
        *(
            [
                f"Drift between repeats of one configuration, the m={part['source_m']} runs' measured step ms: "
                + ", ".join(f"{s} {_figure(steps, 1)}" for s, steps in part["source_step_ms"].items())
                + "; 1-minute load average at each repeat's start: "
                + ", ".join(f"{load:.1f}" for load in part.get("load_average", []))
                + ".",
                "",
            ]
            if part.get("source_step_ms")
            else []
        ),
        *([*(f"Failed: {reason}" for reason in part["failed"]), ""] if part["failed"] else []),
    ]


def _sweep(results: dict, _machine: dict) -> list[str]:
    return [
        *_sweep_verdicts(results),
        "step_ms: median of the run's unprofiled steps (min, max); profiled: the analysed median step; "
        "typical_error: typical / profiled - 1 (docs/numbers.md#step-times).",
        "",
        *_table(SWEEP_COLUMNS, results["sweep"]),
        *(f"Skipped: {reason}" for reason in results.get("skipped", [])),
        "",
    ]


def _seed(results: dict, machine: dict) -> list[str]:
    seed = results["seed"]
    best = ", ".join(f"{key}: m={m}" for key, m in seed["optimum_m"].items())
    return [
        *_verdicts([f"| fastest m (U-curve bottom) | {best} | | |"]),
        "Seed columns, then ours. slot_ms: stage 0's F+B per microbatch in the profiled step; "
        "bubble_measured = 1 - m*slot_ms/step_ms as the seed computes it; analysis_bubble and the "
        "waterfall (ms) from summary.json. p=4 runs 4 single-threaded ranks on "
        f"{machine['cores_usable']} cores ({4 / machine['cores_usable']:.0f}x oversubscribed).",
        "",
        *_table(SEED_COLUMNS + OUR_COLUMNS, seed["rows"]),
    ]


def _dp(jobs: list[dict]) -> list[str]:
    lines = [
        "Each job: `synthetic.data_parallel` (1f1b, one replica's compute x 1.2, a 0.5 ms all-reduce after "
        "each rank's last action), then `python -m bench.child analyze DIR` (read, analyse every pipeline, "
        "write analysis/) in fresh processes; work is the analysis after the imports, peak RSS the process's "
        "own. Recovered: the straggler found, and the largest error of any rank's dp_sync or dp_skew.",
        "",
        "| ranks (p x dp) | m | shape | trace MB (gzip) | work s | wall s | peak RSS MiB | straggler found | "
        "dp_sync max error ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for job in jobs:
        if "work_s" not in job:
            lines.append(
                f"| {job['p'] * job['dp']} ({job['p']} x {job['dp']}) | {job['m']} | {job['shape']} | "
                f"failed: {job['runs'][0]['detail']} |"
            )
            continue
        lines.append(
            f"| {job['p'] * job['dp']} ({job['p']} x {job['dp']}) | {job['m']} | {job['shape']} | "
            f"{job['trace_mb']:.1f} | {_figure(job['work_s'], 2)} | {_figure(job['wall_s'], 2)} | "
            f"{_figure(job['peak_rss_mb'], 0)} | {job['straggler_found']} | {job['dp_sync_max_error_ms']:.2g} |"
        )
    return [*lines, ""]


def _ranks(jobs: list[dict]) -> list[str]:
    lines = [
        "Each job: `synthetic.data_parallel` (1f1b p=8 m=16, GPU-shaped, one replica's compute x 1.2, a 0.5 ms "
        "all-reduce), then `python -m bench.child analyze DIR` in a fresh process per engine: `--jobs 1`, "
        "`--jobs` (one process per core) and a LocalCluster started by the command. s / rank: the work after "
        "the imports (a cluster's start included) over the ranks; driver CPU: the analysing process's own CPU time "
        "(its pool's or cluster's workers not included); MiB / rank: the driver's peak RSS above its "
        "RSS after the imports, over the ranks (a cluster's and a pool's workers are processes of their own). "
        "same: every file of analysis/ byte for byte as `--jobs 1` wrote it.",
        "",
        "| ranks (p x dp) | engine | work s | s / rank | driver CPU s / rank | driver peak MiB | "
        "MiB / rank above imports | same |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for job in jobs:
        for name, entry in job["engines"].items():
            run, shape = entry["run"], f"{job['ranks']} ({job['p']} x {job['dp']})"
            if run["status"] != "ok":
                lines.append(f"| {shape} | {name} | {run['status']}: {run['detail']} | | | | | |")
                continue
            lines.append(
                f"| {shape} | {name} | {run['work_s']:.1f} | {entry['work_s_per_rank']:.3f} | "
                f"{entry['driver_cpu_s_per_rank']:.3f} | "
                f"{run['peak_rss_mb']:.0f} | {entry['rss_above_imports_mib_per_rank']:.2f} | "
                f"{entry['same_as_jobs_1']} |"
            )
    return [*lines, "", *_report_pages(jobs)]


def _report_pages(jobs: list[dict]) -> list[str]:
    """Each job's run page (a result written before the report's figures came has none)."""
    pages = [(job, job["report"]) for job in jobs if "report" in job]
    if not pages:
        return []
    lines = [
        "The job's run page (`analysis.report`, bench.report_page): build s, the report's pages built in the "
        "bench's process; HTML and chart data, the page's files (chart data: every script beside it); opened, "
        "the data the page loads when it opens (past 32 ranks one pipeline's timeline, the others on demand); "
        "load s: headless Chromium from opening the page from file:// to every chart drawn, median of 3.",
        "",
        "| ranks (p x dp) | build s | HTML KB | chart data MB | opened MB | load s |",
        "|---|---|---|---|---|---|",
    ]
    for job, page in pages:
        load = (
            "no browser"
            if page["load_s"] is None
            else f"{page['load_s']:.2f} ({page['load_s_range'][0]:.2f}-{page['load_s_range'][1]:.2f})"
        )
        lines.append(
            f"| {job['ranks']} ({job['p']} x {job['dp']}) | {page['build_s']:.1f} | {page['html_kb']:.0f} | "
            f"{page['chart_data_mb']:.2f} | {page['opened_data_mb']:.2f} | {load} |"
        )
    return [*lines, ""]


# (results key, heading, body from the results and the machine), in the order RESULTS.md shows them
SECTIONS: tuple[tuple[str, str, Callable[[dict, dict], list[str]]], ...] = (
    (
        "throughput",
        "## 1. Analysis throughput",
        lambda r, _: _throughput_verdicts(r["throughput"]) + _throughput(r["throughput"]),
    ),
    (
        "executor",
        "## 2. Executor overhead (p=2, CPU, unprofiled, A B A B)",
        lambda r, _: _executor_verdicts(r["executor"]) + _executor(r["executor"]),
    ),
    ("sweep", "## 3-4. Profiler overhead and the typical step's accuracy (p=2 sweep, one run each)", _sweep),
    ("seed", "## 5. The seed's experiment on CPU (gpipe)", _seed),
    (
        "bubble",
        "## 6. GPipe p=2 m=1: the measured bubble against the formula's 0.5",
        lambda r, _: _bubble(r["bubble"]),
    ),
    (
        "inject",
        "## 7. Injected delays: what the analysis recovers (p=2, CPU, A/B pairs)",
        lambda r, _: _inject(r["inject"]),
    ),
    (
        "predict",
        "## 8. predict: one run's step model at other m against runs there (p=2, CPU)",
        lambda r, _: _predict(r["predict"]),
    ),
    (
        "advice",
        "## 9. advise: one run's ranked candidates, run (p=2, CPU)",
        lambda r, _: _advice(r["advice"]),
    ),
    (
        "foreign",
        "## 9b. advise from the trace alone: no run.json, against calibrated advice and measured steps",
        lambda r, _: _foreign(r["foreign"]),
    ),
    (
        "dp",
        "## 10. A PP x DP job at scale: a synthetic job's analysis, time and peak RSS",
        lambda r, _: _dp(r["dp"]),
    ),
    (
        "ranks",
        "## 11. Hundreds of ranks: time and driver memory per rank, by engine",
        lambda r, _: _ranks(r["ranks"]),
    ),
)
BLOCK = re.compile(r"^<!-- bench: (?P<name>\w+) -->\n.*?^<!-- /bench: (?P=name) -->\n", re.S | re.M)


def blocks(text: str) -> dict[str, str]:
    """The marked section blocks of a RESULTS.md, by name, each with its markers."""
    return {match["name"]: match[0] for match in BLOCK.finditer(text)}


def provenance(entry: dict) -> str:
    """Which command measured a section, when, how long, at which revision and under what load."""
    start, end = entry["load_average_at_start"][0], entry["load_average_at_end"][0]
    return (
        f"Measured by `{entry['command']}`, started {entry['started']}, {entry['seconds']} s, at git "
        f"{entry['git_revision']}; load average {start:.1f} at the start, {end:.1f} at the end."
    )


def render(document: dict, fresh: dict[str, dict], previous: str = "") -> str:
    """RESULTS.md: the sections in `fresh` (name -> provenance) rendered from the document's results, every
    other section's block kept from `previous` (an earlier RESULTS.md) as it was."""
    results, machine = document["results"], document["machine"]
    kept = blocks(previous)
    lines = [
        "# Benchmarks",
        "",
        "Each section says the command, start, duration and git revision that measured it: "
        "`python -m bench --only PARTS` measures those parts again and keeps the other sections as they were. "
        f"Latest: `{document['command']}`, {document['started']}, at git {document['git_revision']}.",
        "",
        *(
            []
            if document.get("complete", True)
            else [
                "**Partial**: the latest bench was interrupted or is still running; only the sections it "
                "finished are its.",
                "",
            ]
        ),
        f"Machine: {machine['cpu']}, {machine['cores_usable']} usable cores, {machine['memory_gib']} GiB, "
        f"{machine['platform']}, Python {machine['python']} (other work on the machine inflates and spreads "
        "every time). Versions: " + ", ".join(f"{k} {v}" for k, v in document["versions"].items()) + ".",
        "",
        "Figures are medians of repeats with (min-max); `wide` marks a range over 25% of the median, too noisy "
        "to read the median alone; a verdict is given only when the whole range is on one side of the target.",
        "",
        "Reproduce: `make bench` (all parts), or some parts, e.g. "
        "`.venv/bin/python -m bench --only throughput --sizes-mb 50 --ranks 4`, `--only sim,profiler --ms '1 2 4 8'`, "
        "`--only executor --pairs 3`, `--only inject,predict`, `--only advice`.",
        "",
    ]
    for name, heading, body in SECTIONS:
        if name in fresh:
            block = [
                f"<!-- bench: {name} -->",
                heading,
                "",
                provenance(fresh[name]),
                "",
                *body(results, machine),
            ]
            lines += [*block, f"<!-- /bench: {name} -->", ""]
        elif name in kept:
            lines += [kept[name]]
    return "\n".join(lines)
