"""bench/results.json's document -> bench/RESULTS.md: headline ratios first, then one section per part."""

from __future__ import annotations

from analysis.schema import WATERFALL_TERMS
from bench.stats import Stats
from runners.results import markdown_table

SEED_COLUMNS = ("p", "m", "slot_ms", "step_ms", "bubble_theory", "bubble_measured")
OUR_COLUMNS = ("analysis_bubble", "profiled_step_ms", *(f"{term}_ms" for term in WATERFALL_TERMS))
SWEEP_COLUMNS = (
    "schedule",
    "m",
    "step_ms",
    "step_ms_min",
    "step_ms_max",
    "profiled_step_ms",
    "profiler_ratio",
    "simulated_step_ms",
    "sim_error",
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


def _headline(results: dict) -> list[str]:
    rows = []
    for size in results.get("throughput", {}).get("sizes", []):
        for name, label in (
            ("hta_over_ours", "HTA load time / ours"),
            ("ours_over_decode", "ours / typed decoding"),
            ("rss_over_size", "our peak RSS / trace bytes"),
        ):
            if name in size["ratios"]:
                ratio = size["ratios"][name]
                rows.append(
                    f"| {label} ({size['mb']:.0f} MB) | {_figure(ratio, 2)} | {ratio['target']} | {ratio['verdict']} |"
                )
            else:
                rows.append(f"| {label} ({size['mb']:.0f} MB) | {_unmeasured(size, name)} | | |")
    executor = results.get("executor")
    if executor and not executor["available"]:
        rows.append(f"| native / torch step time | {executor['reason']} | 1.0 | |")
    for config in (executor or {}).get("configs", []):
        shown = config.get("failed") or _figure(config["native_over_torch"])
        rows.append(
            f"| native / torch, {config['schedule']} m={config['m']} | {shown} | 1.0 | {config.get('verdict', '')} |"
        )
    if "profiler" in results:
        profiler = results["profiler"]
        rows.append(
            f"| profiled / unprofiled step (CPU, {profiler['n']} runs) | {_figure(profiler)} | "
            f"{profiler['target']} | {profiler['verdict']} |"
        )
    if "sim" in results:
        sim = results["sim"]
        rows.append(
            f"| abs(simulated / measured - 1) ({sim['runs_within']}/{sim['runs']} within target) | "
            f"{_figure(sim)} | {sim['target']} | {sim['verdict']} |"
        )
    bubble = results.get("bubble", {})
    if "deviation" in bubble:
        deviation = bubble["deviation"]
        rows.append(
            f"| abs(bubble - 0.5), gpipe p=2 m=1 ({deviation['n']} runs) | {_figure(deviation, 4)} | "
            f"{deviation['target']} | {deviation['verdict']} |"
        )
    if "seed" in results:
        best = ", ".join(f"{key}: m={m}" for key, m in results["seed"]["optimum_m"].items())
        rows.append(f"| fastest m (U-curve bottom) | {best} | | |")
    return ["| figure | median (min-max) | target | verdict |", "|---|---|---|---|", *rows, ""]


def _throughput(part: dict) -> list[str]:
    lines = [
        "## 1. Analysis throughput",
        "",
        f"Source run replicated: `{part['source']}`. Times are the work inside a fresh process after its "
        f"imports (wall = the whole process); "
        f"peak RSS is the process's own high-water mark, 'with workers' the sampled peak of the RSS summed "
        f"over it and its pool workers (HTA parses ranks in a pool). "
        f"Ours and decoding: "
        f"{part['repeats']} alternating repeats; HTA: once per size, stopped after {part['hta_timeout_s']:.0f} s.",
        "",
    ]
    for size in part["sizes"]:
        lines += [
            f"### {size['mb']:.0f} MB, {size['ranks']} ranks, {size['steps_per_rank']} steps per rank",
            "",
            "| task | work s | wall s | peak RSS MiB | with workers MiB | status |",
            "|---|---|---|---|---|---|",
        ]
        for task, figures in size["tasks"].items():
            if figures["status"] == "ok":
                lines.append(
                    f"| {task} | {_figure(figures['work_s'], 2)} | {_figure(figures['wall_s'], 2)} | "
                    f"{_figure(figures['peak_rss_mb'], 0)} | {_figure(figures['tree_rss_mb'], 0)} | ok |"
                )
            else:
                lines.append(
                    f"| {task} | - | - | - | {figures['tree_rss_mb_at_stop']:.0f} at stop | "
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
    growth = part.get("growth")
    if growth:
        lines.append(f"Growth over a {growth['size_ratio']:.1f}x larger set (linear = the same factor):")
        lines += [
            f"- {task}: time x{g['time_ratio']:.2f}, peak RSS x{g['rss_ratio']:.2f}"
            for task, g in growth.items()
            if task != "size_ratio"
        ]
        lines.append("")
    return lines


def _executor(part: dict) -> list[str]:
    lines = ["## 2. Executor overhead (p=2, CPU, unprofiled, A B A B)", ""]
    if not part["available"]:
        return lines + [part["reason"], ""]
    lines += [
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


def render(document: dict) -> str:
    results, machine = document["results"], document["machine"]
    lines = [
        "# Benchmarks",
        "",
        f"Written by `{document['command']}` (`make bench` runs it with the defaults), {document['started']}, "
        f"in {document['seconds']} s, "
        f"at git {document['git_revision']}.",
        "",
        f"Machine: {machine['cpu']}, {machine['cores_usable']} usable cores, {machine['memory_gib']} GiB, "
        f"{machine['platform']}, Python {machine['python']}; load average "
        f"{machine['load_average_at_start'][0]:.1f} at the start, {document['load_average_at_end'][0]:.1f} at the end "
        f"(other work on the machine inflates and spreads every time). Versions: "
        + ", ".join(f"{k} {v}" for k, v in document["versions"].items())
        + ".",
        "",
        "Figures are medians of repeats with (min-max); `wide` marks a range over 25% of the median, too noisy "
        "to read the median alone; a verdict is given only when the whole range is on one side of the target.",
        "",
        *(
            []
            if document.get("complete", True)
            else [
                "**Partial**: the bench was interrupted or is still running; only the parts below were measured.",
                "",
            ]
        ),
        "Reproduce: `make bench` (all parts), or one part at a time, e.g. "
        "`.venv/bin/python -m analysis bench --only throughput --size-mb 50`, `--only sim,profiler --ms '1 2 4 8'`, "
        "`--only executor --pairs 3`; every figure here comes from the one command above.",
        "",
        *_headline(results),
    ]
    if "throughput" in results:
        lines += _throughput(results["throughput"])
    if "executor" in results:
        lines += _executor(results["executor"])
    if "sweep" in results:
        lines += [
            "## 3-4. Profiler overhead and simulator accuracy (p=2 sweep, one run each)",
            "",
            "step_ms: median of the run's unprofiled steps (min, max); profiled: the analysed median step; "
            "sim_error: simulated / profiled - 1.",
            "",
            *_table(SWEEP_COLUMNS, results["sweep"]),
            *(f"Skipped: {reason}" for reason in results.get("skipped", [])),
            "",
        ]
    if "seed" in results:
        lines += [
            "## 5. The seed's experiment on CPU (gpipe)",
            "",
            "Seed columns, then ours. slot_ms: stage 0's F+B per microbatch in the profiled step; "
            "bubble_measured = 1 - m*slot_ms/step_ms as the seed computes it; analysis_bubble and the "
            "waterfall (ms) from summary.json. p=4 runs 4 single-threaded ranks on "
            f"{machine['cores_usable']} cores ({4 / machine['cores_usable']:.0f}x oversubscribed).",
            "",
            *_table(SEED_COLUMNS + OUR_COLUMNS, results["seed"]["rows"]),
        ]
    if "bubble" in results:
        lines += _bubble(results["bubble"])
    return "\n".join(lines)


def _bubble(part: dict) -> list[str]:
    lines = ["## 6. GPipe p=2 m=1: the measured bubble against the formula's 0.5", ""]
    if "bubbles" in part:
        lines += [
            f"Bubbles measured ({len(part['bubbles'])} runs): "
            + ", ".join(f"{b:.4f}" for b in part["bubbles"])
            + ".",
            "",
            "Calibration against the m=1 cells (whole-batch F and B, the calibration's own work), "
            f"abs(cell / calibration - 1) per rank: {_figure(part['calibration_error'])}.",
            "",
        ]
    return lines + [f"Failed: {reason}" for reason in part["failed"]] + [""]
