"""What every chart shares: the Plot (a chart and its data), one colour per quantity, the width.

Charts name their data (`alt.NamedData`) and the frames ride beside them until `Plot.spec()` puts
them into the spec's top-level `datasets`. That keeps altair out of the data path: its 5000-row
limit and its schema validation (which costs seconds per few thousand inline rows) then apply only
to the chart's small structure. Pages ship every spec in a script file beside the page, not in the
HTML; a run page holds one step's cells and timelines draw on canvas, so 50,000 cells (about 6 MB)
still open in seconds (tests/test_report_browser.py measures it).
"""

from __future__ import annotations

from dataclasses import dataclass

import altair as alt
import polars as pl

from analysis.vocabulary import FILL_DRAIN, IDEAL, RESIDUAL, VARIABILITY, Effect, Part

# One colour per quantity, wherever it is drawn: a rank's part, a waterfall term (a term takes the
# colour of the part it is the step-level effect of).
_PART_COLOURS = {
    Part.COMPUTE: "#4c78a8",
    Part.BUBBLE: "#bab0ac",
    Part.SMALL_GEMM: "#e45756",
    Part.SLOWDOWN: "#ff9da6",
    Part.LAUNCH_OVERHEAD: "#9d755d",
    Part.P2P_WAIT: "#b279a2",
    Part.DP_SYNC: "#54a24b",
    Part.OTHER: "#e0e0e0",
}
_RUNG_COLOURS = {
    IDEAL: _PART_COLOURS[Part.COMPUTE],
    FILL_DRAIN: _PART_COLOURS[Part.BUBBLE],
    Effect.IMBALANCE: "#f58518",
    Effect.SMALL_BATCHES: _PART_COLOURS[Part.SMALL_GEMM],
    Effect.INTERFERENCE: _PART_COLOURS[Part.SLOWDOWN],
    Effect.HOST: _PART_COLOURS[Part.LAUNCH_OVERHEAD],
    Effect.TRANSFER: _PART_COLOURS[Part.P2P_WAIT],
    Effect.TAIL: _PART_COLOURS[Part.OTHER],
    VARIABILITY: "#ff9da6",
    RESIDUAL: "#eeca3b",
}
COLOURS = {str(name): colour for name, colour in (_PART_COLOURS | _RUNG_COLOURS).items()} | {
    "measured": "#333333"
}
WIDTH = 900
# m is a power of two in every sweep we run; ticks there instead of log-scale ticks at 1.5, 2.5, ...
M_AXIS = alt.Axis(values=[2**k for k in range(13)], format="d")


def m_x(*frames: pl.DataFrame) -> alt.X:
    """The m axis (log 2) over the frames' m: one m alone gets a domain an octave either side, where vega
    would otherwise spread its ticks from 1 to 4096 over one point."""
    ms = [m for frame in frames for m in frame["m"].to_list() if m is not None]
    low, high = (min(ms), max(ms)) if ms else (1, 2)
    if low == high:
        low, high = low / 2, high * 2
    return alt.X(
        "m:Q",
        scale=alt.Scale(type="log", base=2, domain=[low, high]),
        axis=M_AXIS,
        title="microbatches m (log scale)",
    )


@dataclass(frozen=True)
class Plot:
    chart: alt.TopLevelMixin
    datasets: dict[str, pl.DataFrame]

    def spec(self, chart: dict | None = None) -> dict:
        """The vega-lite spec with every dataset inlined (validated by altair without the data); `chart`:
        this plot's chart as a dict already, shared with other plots (altair validates each to_dict)."""
        chart = self.chart.to_dict() if chart is None else chart
        return chart | {"datasets": {name: f.to_dicts() for name, f in self.datasets.items()}}


def scale(colours: dict[str, str], domain: tuple[str, ...]) -> alt.Scale:
    return alt.Scale(domain=list(domain), range=[colours[name] for name in domain])


def named(name: str) -> alt.NamedData:
    return alt.NamedData(name=name)
