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

# One colour per quantity, wherever it is drawn: a rank's part, a waterfall term.
COLOURS = {
    "compute": "#4c78a8",
    "ideal": "#4c78a8",
    "formula_bubble": "#bab0ac",
    "bubble": "#bab0ac",
    "imbalance": "#f58518",
    "small_gemm": "#e45756",
    "slowdown": "#ff9da6",
    "launch_overhead": "#9d755d",
    "p2p_wait": "#b279a2",
    "dp_sync": "#54a24b",
    "other": "#e0e0e0",
    "variability": "#ff9da6",
    "residual": "#eeca3b",
    "measured": "#333333",
}
WIDTH = 900
# m is a power of two in every sweep we run; ticks there instead of log-scale ticks at 1.5, 2.5, ...
M_AXIS = alt.Axis(values=[2**k for k in range(13)], format="d")


@dataclass(frozen=True)
class Plot:
    chart: alt.TopLevelMixin
    datasets: dict[str, pl.DataFrame]

    def spec(self) -> dict:
        """The vega-lite spec with every dataset inlined (validated by altair without the data)."""
        return self.chart.to_dict() | {"datasets": {name: f.to_dicts() for name, f in self.datasets.items()}}


def scale(colours: dict[str, str], domain: tuple[str, ...]) -> alt.Scale:
    return alt.Scale(domain=list(domain), range=[colours[name] for name in domain])


def named(name: str) -> alt.NamedData:
    return alt.NamedData(name=name)
