"""The index: every run (newest first, errors included), the pairs compared, native against torch, and the
sweep views."""

from __future__ import annotations

import html

import polars as pl

from analysis.report import advice_section, sweep_charts, sweeps, verdict_section
from analysis.report.pages import Column, Figure, Markup, link, number, table
from analysis.report.runs import Run
from analysis.schema import Summary
from analysis.vocabulary import Level
from runners.presets import CALIBRATED_MS

RUN_COLUMNS = [
    Column("run", "the run directory under traces/; links to its page", text=True),
    Column("schedule", "pipeline schedule", text=True),
    Column("engine", "native: this project's executor; torch: torch.distributed.pipelining", text=True),
    Column("device", "where the stages ran", text=True),
    Column("p", "pipeline ranks"),
    Column("m", "microbatches per step"),
    Column("v", "chunks (stages) per rank"),
    Column(
        "step, profiled (ms)",
        "measured step time: median over the analysed profiled steps (a job of several pipelines: its "
        "slowest pipeline's, the one whose step alone, less its ranks' wait for slower replicas, is longest)",
        show=number(3),
    ),
    Column(
        "bubble formula",
        "idle fraction of the step by the schedule's geometry: its order at unit times ((p-1)/(v*m+p-1) for "
        "gpipe, 1f1b, interleaved)",
        show=number(3),
    ),
    Column(
        "bubble (busy-time)",
        "1 - busy time of all ranks / (p * step time), as a fraction of the step",
        show=number(3),
    ),
    Column(
        "bubble (seed)",
        "the seed's 1 - m*t_slot/step: 1 - the ranks' work timed alone / (p * step time); — without the "
        "isolated calibration",
        show=number(3),
    ),
    Column(
        "trust",
        "high: the pipeline model fits the trace; low: hover for why (docs/numbers.md#trust)",
        text=True,
    ),
    Column(
        "top finding",
        "the verdict's largest recoverable time, in ms (docs/numbers.md#verdict)",
        text=True,
    ),
    Column(
        "flags",
        "contended: more rank threads than cores (ranks took turns); noisy: its steps spread beyond the "
        "threshold in summary.json rules. A flagged row is no finding about the schedule",
        text=True,
    ),
]


def runs_table(runs: list[Run], pages: dict[str, str]) -> str:
    rows, classes = [], []
    for run in runs:
        if run.error is not None:
            config = run.config
            cells = [config.get(k) for k in ("schedule", "engine", "device", "p", "m", "v")]
            if run.not_a_pipeline:
                cells[0] = "not a pipeline"
            rows.append(
                [
                    Markup(html.escape(run.run_id)),
                    *map(_text, cells),
                    *[None] * 4,  # step, the three bubbles (shown as —)
                    "—",  # the trust
                    Markup(html.escape(run.error), css="error"),
                    "—",
                ]
            )
            classes.append("not-pipeline" if run.not_a_pipeline else "error")
            continue
        s = run.summary
        if s.scope == "ranks":
            rows.append(_ranks_row(run, pages[run.run_id]))
            classes.append("flagged")
            continue
        rows.append(
            [
                link(pages[run.run_id], run.run_id),
                _text(s.schedule),
                _text(s.engine),
                _text(s.device),
                _text(s.p),
                _text(s.m),
                _text(s.v),
                s.step_time_ms,
                s.bubble_formula,
                s.bubble_measured,
                s.bubble_seed,
                verdict_section.trust_mark(s.trust),
                verdict_section.top_finding(s),
                ", ".join(s.flags) or "—",
            ]
        )
        classes.append("flagged" if s.flags or (s.trust and s.trust.level != Level.HIGH) else "")
        if s.dp > 1:
            rows += _pipeline_rows(s)
            classes += ["pipeline"] * len(s.pipelines)
    return table(RUN_COLUMNS, rows, classes)


def _ranks_row(run: Run, page: str) -> list:
    """Some ranks of a bigger job: the job's configuration where run.json says it, the longest present
    rank's step and the largest own bubble; no pipeline figure."""
    s = run.summary
    present = (
        f"rank(s) {', '.join(map(str, s.ranks_present[:4]))}{' ...' if len(s.ranks_present) > 4 else ''}"
    )
    return [
        link(page, run.run_id),
        _text(s.schedule),
        _text(s.engine),
        _text(s.device),
        _text(s.p),
        _text(s.m),
        _text(s.v),
        s.step_time_ms,
        s.bubble_formula,
        max(r.bubble_measured for r in s.ranks),
        None,
        verdict_section.trust_mark(s.trust),
        f"{present} of {s.world_size} alone",
        "—",
    ]


def _pipeline_rows(s: Summary) -> list[list]:
    """Below a job's row (the slowest pipeline's figures), one row per pipeline: its step, its step alone
    (less its ranks' wait for slower replicas) and its busy-time bubble."""
    rows = []
    for j, line in enumerate(s.pipelines):
        late = s.straggler is not None and s.straggler.pipeline == j
        name = (
            f"· pipeline {j}: ranks {', '.join(map(str, line.ranks))}, alone {line.step_time_alone_ms:.3f} ms"
            f"{f' (straggler, +{s.straggler.slower_ms:.3f} ms)' if late else ''}"
        )
        rows.append(
            [Markup(html.escape(name)), *[None] * 3, _text(s.p), None, None, line.step_time_ms, None]
            + [line.bubble_measured, None, None, None, None]
        )
    return rows


def _whole(run: Run) -> bool:
    """A run analysed as a whole pipeline job (not an error, not some of its ranks)."""
    return run.error is None and run.summary.scope != "ranks"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _text(value) -> str:
    return "—" if value is None else str(value)


def engines_table(runs: pl.DataFrame) -> str:
    pairs = sweeps.engine_pairs(runs)
    if pairs.is_empty():
        return "<p>No configuration was run with both engines yet (<code>make trace ENGINE=torch ...</code>).</p>"
    columns = [
        Column(name, meaning, text=name in ("schedule", "device"))
        for name, meaning in (
            ("schedule", "pipeline schedule"),
            ("p", "pipeline ranks"),
            ("m", "microbatches"),
            ("v", "chunks per rank"),
            ("device", "where the stages ran"),
        )
    ]
    columns += [
        Column(
            "native (ms)", "profiled step time with this project's executor (the median run)", show=number(3)
        ),
        Column("native runs", "how many runs of this configuration the native figure is the median of"),
        Column(
            "torch (ms)",
            "profiled step time with torch.distributed.pipelining (the median run)",
            show=number(3),
        ),
        Column("torch runs", "how many runs the torch figure is the median of"),
        Column("torch / native", "step time ratio; above 1 the native executor is faster", show=number(3)),
    ]
    return table(
        columns,
        [
            list(row)
            for row in pairs.select(
                "schedule", "p", "m", "v", "device", "native", "native_runs", "torch", "torch_runs", "ratio"
            ).iter_rows()
        ],
    )


def sweep_figures(runs: pl.DataFrame, by_id: dict[str, Run]) -> list[Figure]:
    """Bubble vs m for all families, step time vs m per family (measured, and predicted from one of its
    runs), memory vs m, schedules at equal m."""
    family_runs = sweeps.families(runs)
    figures = []
    if not family_runs.is_empty():
        figures.append(
            Figure(
                "bubble-vs-m",
                sweep_charts.bubble_vs_m(sweeps.formula_curve(family_runs), family_runs),
                "Bubble as a fraction of the step against m: dashed lines are the formula, each schedule's "
                "order replayed at unit times ((p-1)/(v*m+p-1) for gpipe, 1f1b and interleaved), points the "
                "measured 1 - busy / (p * step time).",
            )
        )
        chosen = sweeps.median_per_m(family_runs)
        for i, family in enumerate(chosen["family"].unique(maintain_order=True)):
            rows = chosen.filter(pl.col("family") == family)
            source = by_id[sweeps.prediction_source(rows)]
            ms = sorted({*CALIBRATED_MS, *rows["m"]} & set(range(1, rows["m"].max() + 1)))
            predicted = sweeps.predicted_steps(source.analysis, ms)
            figures.append(
                Figure(
                    f"step-vs-m-{i}",
                    sweep_charts.step_time_vs_m(
                        sweeps.step_terms(rows), sweeps.measured_steps(rows), predicted, family
                    ),
                    f"{family}: step time against m, stacked by waterfall term (ms); the line is the measured step "
                    "time (at an m run several times, the run of median step, its count in the tooltip), 'best m' "
                    "marks its minimum. "
                    + (
                        f"The dashed line is the step predicted from the m={source.summary.m} run alone "
                        "(python -m analysis predict: its typical step, every input at its mean, replayed at each "
                        "m, busy times scaled by the isolated calibration), 'predicted best' its minimum. "
                        if not predicted.is_empty()
                        else f"No prediction: the m={source.summary.m} run has no isolated calibration. "
                    )
                    + "More microbatches shrink the bubble but make each GEMM smaller and add a p2p hop per "
                    "microbatch: the U-curve.",
                )
            )
            advice = advice_section.sweep_figure(source, runs, f"advice-vs-m-{i}")
            figures += [advice] if advice is not None else []
        memory = sweeps.peak_memory(family_runs)
        if not memory.is_empty():
            figures.append(
                Figure(
                    "memory-vs-m",
                    sweep_charts.peak_memory_vs_m(memory),
                    "Peak activation memory (largest rank, MiB) against m: GPipe holds every "
                    "microbatch until its backward, 1F1B at most p.",
                )
            )
    compared = sweeps.schedule_comparison(runs)
    if not compared.is_empty():
        figures.append(
            Figure(
                "schedules",
                sweep_charts.schedules_side_by_side(compared),
                "Schedules side by side at equal p and m: step time stacked by waterfall term (ms).",
            )
        )
    return figures


def body(runs: list[Run], pages: dict[str, str], comparisons: str) -> tuple[str, list[Figure]]:
    """The index; `comparisons`: its section of diff pages (analysis.report.diff_index), below the runs."""
    analysed = sweeps.runs_frame([sweeps.run_row(r.run_id, r.summary, r.config) for r in runs if _whole(r)])
    figures = sweep_figures(analysed, {r.run_id: r for r in runs if _whole(r)})
    others = sum(r.not_a_pipeline for r in runs)
    failed = sum(r.error is not None for r in runs) - others
    counts = [_count(len(runs), "run") + ", newest first"]
    counts += [f"{_count(others, 'job')} not pipeline-parallel"] if others else []
    counts += [f"{failed} could not be analysed"] if failed else []
    sections = [
        "<h1>Pipeline runs</h1>",
        f'<p class="note">{", ".join(counts)}. '
        "Bubbles are fractions of the step; hover a column header for what each number is.</p>",
        runs_table(runs, pages),
        comparisons,
        "<h2>Native executor against torch.distributed.pipelining</h2>",
        engines_table(analysed),
        "<h2>Sweeps</h2>",
        "\n".join(f.html() for f in figures)
        if figures
        else "<p>No sweep yet: a sweep is one schedule, p and v at several m "
        '(<code>make sweep MS="1 2 4 8"</code>).</p>',
    ]
    return "\n".join(sections), figures
