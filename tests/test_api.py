"""The guide's notebook example (docs/guide.md, "In a notebook") runs as written, on the runtime
dependencies alone, against a run in traces/latest."""

from __future__ import annotations

import re

from conftest import REPO

from analysis import analyze
from runners.schedules import build
from synthetic import write_run


def guide_example() -> str:
    section = (REPO / "docs" / "guide.md").read_text().split("## In a notebook", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_guides_notebook_example_runs(tmp_path, monkeypatch, capsys):
    write_run(tmp_path / "traces" / "run", build("1f1b", 2, 4), steps=3)
    (tmp_path / "traces" / "latest").symlink_to("run")
    monkeypatch.chdir(tmp_path)
    exec(compile(guide_example(), "docs/guide.md", "exec"), {})
    printed = capsys.readouterr().out
    assert printed.startswith("1f1b p=2 m=4: step ") and "Waterfall(" in printed and "bubble" in printed


def test_analyze_returns_the_typed_summary_and_the_frames(tmp_path):
    write_run(tmp_path, build("gpipe", 2, 4), steps=2)
    run = analyze(tmp_path)
    assert run.summary.p == 2 and run.cells.height > 0 and set(run.parts["rank"]) == {0, 1}
    assert (tmp_path / "analysis" / "summary.json").is_file()  # written, as `analyze` would
    again = analyze(tmp_path, schedule="gpipe", m=4)  # hints: analysed anew, same figures
    assert again.summary.step_time_ms == run.summary.step_time_ms
