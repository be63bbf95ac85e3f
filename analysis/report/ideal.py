"""The simulated ideal timeline as the report draws it: analysis.ideal's replay in the measured frame's
shape (analysis.report.frames), with the caption saying where its durations came from.
"""

from __future__ import annotations

import polars as pl

from analysis.ideal import ideal_replay
from analysis.report.frames import ideal_frame


def ideal_timeline(config: dict, cells: pl.DataFrame | None) -> tuple[pl.DataFrame | None, str]:
    """The ideal timeline's frame and a caption saying where its durations came from (or why none)."""
    _, timeline, caption = ideal_replay(config, cells)
    return (None if timeline is None else ideal_frame(list(timeline.rows))), caption
