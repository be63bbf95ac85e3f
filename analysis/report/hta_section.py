"""The run page's Holistic Trace Analysis section: RUN/hta.json's figures beside ours per rank, HTA's top
kernels and the line on where the two agree; without hta.json, how to get one. HTA itself is not run
here (analysis.hta_figures.read only reads what `python -m analysis hta` wrote)."""

from __future__ import annotations

import html

from analysis.errors import InputError
from analysis.hta import compare as hta_compare
from analysis.hta import figures as hta_figures
from analysis.report.pages import Column, number, table
from analysis.report.runs import Run

HEADING = "<h2>Holistic Trace Analysis beside ours</h2>"
NON_COMPUTE_NOTE = (
    "HTA's idle is time no kernel ran on any stream: a receive's NCCL kernel waiting for its peer is "
    "non-compute time to HTA, and bubble or p2p_wait to us."
)


def section_html(run: Run) -> str:
    if run.summary.device == "cpu":
        return f"{HEADING}<p>HTA's breakdowns are of GPU kernels; this run ran on CPU.</p>"
    try:
        figures = hta_figures.read(run.path)
    except InputError as error:
        return f"{HEADING}<p>{html.escape(str(error))}</p>"
    if figures is None:
        where = html.escape(str(run.path))
        return (
            f"{HEADING}<p>No HTA figures yet: <code>make hta RUN={where}</code> (in the project's folder; or "
            f"its <code>.venv/bin/python -m analysis hta</code> with that folder) runs Holistic Trace Analysis "
            "on the rank traces and writes <code>hta.json</code>: its temporal, idle-time and kernel "
            "breakdowns, shown here beside ours.</p>"
        )
    ours = hta_compare.ours_beside(run.analysis)
    beside = ours if hta_compare.comparable(figures, ours) else {}
    columns = [
        Column("rank", "pipeline rank (one trace)"),
        *(
            Column(f.header, f.meaning, show=hta_compare.shown)
            for f in (*hta_compare.HTA_FIELDS, *hta_compare.OURS_FIELDS)
        ),
    ]
    rows = [
        [
            rank.rank,
            *(field.value(rank) for field in hta_compare.HTA_FIELDS),
            *(
                None if rank.rank not in beside else field.value(beside[rank.rank])
                for field in hta_compare.OURS_FIELDS
            ),
        ]
        for rank in figures.ranks
    ]
    left_out = (
        f" Ranks without GPU kernels, left out: {', '.join(map(str, figures.ranks_without_kernels))}."
        if figures.ranks_without_kernels
        else ""
    )
    kernels = [
        Column("rank", "pipeline rank"),
        Column(
            "kernel", f"the kernel's name (its first {hta_figures.KERNEL_NAME_CHARS} characters)", text=True
        ),
        Column("type", "HTA's kernel type", text=True),
        Column("total (ms)", "the kernel's summed run time over HTA's window", show=number(3)),
    ]
    top = [
        [rank.rank, hta_figures.short_name(kernel.name), kernel.kernel_type, kernel.total_ms]
        for rank in figures.ranks
        for kernel in rank.top_kernels
    ]
    caption = (
        f"Holistic Trace Analysis {figures.hta_version}, per rank ({hta_compare.WINDOWS}). {NON_COMPUTE_NOTE}"
        f"{left_out} {hta_compare.verdict(figures, ours)}"
    )
    return "\n".join(
        [
            HEADING,
            table(columns, rows),
            f"<p>{html.escape(caption)}</p>",
            f"<h3>Top kernels by time (HTA's kernel breakdown, at most {hta_figures.TOP_KERNELS} a rank)</h3>",
            table(kernels, top),
        ]
    )
