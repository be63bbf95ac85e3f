"""The HTML skeleton every page shares: head, escaped tables, chart slots, the page's chart script.

Everything that comes from a trace or a run directory goes through `html.escape` (text) or
`urllib.parse.quote` (links); chart specs travel as JSON in a separate script file with `<` escaped,
so a name like `</script><script>...` stays text wherever it lands.
"""

from __future__ import annotations

import html
import json
from dataclasses import dataclass
from urllib.parse import quote

from analysis.report.assets import bundle_name
from analysis.report.plot import Plot
from analysis.report.site import ASSETS_DIR


@dataclass(frozen=True)
class Figure:
    """One chart on a page: where it goes, what it shows, how to draw it, and the caption under it."""

    slot: str
    plot: Plot
    caption: str
    renderer: str = "svg"  # canvas for charts with many marks (timelines)

    def html(self) -> str:
        return f'<div class="chart" id="{self.slot}"></div>\n{_caption(self.caption)}'


@dataclass(frozen=True)
class Choice:
    """A chart the reader picks from a list, drawn on demand: each option's spec is a script file beside
    the page (browsers load <script src> from file://, never fetch()), so the page opens with one option's
    data, not all of them. `stem` is the page's file stem, which the option files share."""

    slot: str
    label: str
    options: list[tuple[str, Plot]]  # what the picker says, what it draws
    chosen: int  # the option drawn when the page opens
    caption: str
    stem: str
    renderer: str = "canvas"

    def file(self, i: int) -> str:
        return f"{self.stem}.{self.slot}-{i}.js"

    def html(self) -> str:
        options = "".join(
            f'<option value="{html.escape(quote(self.file(i)))}"{" selected" if i == self.chosen else ""}>'
            f"{html.escape(text)}</option>"
            for i, (text, _) in enumerate(self.options)
        )
        return (
            f'<p><label>{html.escape(self.label)} <select data-chart="{self.slot}">{options}</select></label></p>\n'
            f'<div class="chart" id="{self.slot}"></div>\n{_caption(self.caption)}'
        )

    def scripts(self) -> dict[str, str]:
        """File name -> the script that hands its option's chart to assets/embed.js. Options that share a
        chart (their data differs) have it turned into a spec once."""
        charts: dict[int, dict] = {}
        scripts = {}
        for i, (_, plot) in enumerate(self.options):
            if id(plot.chart) not in charts:
                charts[id(plot.chart)] = plot.chart.to_dict()
            chart = {"id": self.slot, "file": self.file(i), "renderer": self.renderer}
            scripts[self.file(i)] = (
                f"window.REPORT_DRAW({_json(chart | {'spec': plot.spec(charts[id(plot.chart)])})});\n"
            )
        return scripts


def _caption(text: str) -> str:
    return f'<p class="caption">{html.escape(text)}</p>'


@dataclass(frozen=True)
class Markup:
    """Table cell content that is already safe HTML (a link built from escaped parts)."""

    text: str
    css: str = "text"


@dataclass(frozen=True)
class Column:
    """A table column: header, the tooltip saying what the number is, and how to show a value."""

    header: str
    meaning: str
    show: object = str  # value -> text
    text: bool = False  # left-aligned words rather than numbers


def number(digits: int):
    return lambda value: "—" if value is None else f"{value:.{digits}f}"


def table(
    columns: list[Column], rows: list[list], row_classes: list[str] | None = None, css: str | None = None
) -> str:
    """An HTML table; every header carries its meaning as a tooltip, every cell is escaped text; `css`:
    the table's class (`prose`: its text columns wrap)."""
    head = "".join(
        f'<th title="{html.escape(c.header + ": " + c.meaning)}"{_css(c)}>{html.escape(c.header)}</th>'
        for c in columns
    )
    body = []
    for i, row in enumerate(rows):
        cells = "".join(_cell(column, value) for column, value in zip(columns, row, strict=True))
        kind = f' class="{row_classes[i]}"' if row_classes and row_classes[i] else ""
        body.append(f"<tr{kind}>{cells}</tr>")
    styled = f' class="{css}"' if css else ""
    return f"<table{styled}><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _css(column: Column) -> str:
    return ' class="text"' if column.text else ""


def _cell(column: Column, value) -> str:
    if isinstance(value, Markup):
        return f'<td class="{value.css}">{value.text}</td>'
    return f'<td{_css(column)} title="{html.escape(column.header)}">{html.escape(column.show(value))}</td>'


def link(href: str, text: str) -> Markup:
    return Markup(f'<a href="{html.escape(quote(href))}">{html.escape(text)}</a>')


def chart_script(figures: list[Figure]) -> str:
    """The page's data script: every chart's vega-lite spec, data included, for assets/embed.js."""
    charts = [{"id": f.slot, "renderer": f.renderer, "spec": f.plot.spec()} for f in figures]
    return f"window.REPORT_CHARTS = {_json(charts)};\n"


def _json(value) -> str:
    """JSON for a script, `<` escaped so no string in it can close the script element."""
    return json.dumps(value, separators=(",", ":"), sort_keys=True).replace("<", "\\u003c")


def document(title: str, body: str, script: str, assets: str) -> str:
    """A whole page: `assets` is the relative path to the assets folder, `script` the page's chart script."""
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<link rel="stylesheet" href="{assets}/report.css">
</head>
<body data-charts="pending">
{body}
<script src="{assets}/{bundle_name()}"></script>
<script src="{html.escape(quote(script))}"></script>
<script src="{assets}/embed.js"></script>
</body>
</html>
"""


def assets_path(depth: int) -> str:
    return "/".join([".."] * depth + [ASSETS_DIR])
