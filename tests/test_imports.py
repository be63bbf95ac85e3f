"""The analysis never imports torch: importing it costs seconds per command, and the analysis must
run where torch is absent (a laptop reading a GPU job's traces)."""

import subprocess
import sys

ANALYSIS_COMMANDS = [
    "analysis.cli.analyze",
    "analysis.cli.whatif",
    "analysis.job.run_dir",
    "analysis.merge.merged",
    "analysis.report",
    "synthetic.generate",
]


def test_analysis_commands_import_without_torch():
    imported = "sorted(m for m in sys.modules if m.split('.')[0] == 'torch')"
    code = f"import sys; import {', '.join(ANALYSIS_COMMANDS)}; print({imported})"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_the_report_and_the_merge_read_what_analyze_stored_and_compute_no_forecast():
    """Neither the report's nor the merge's modules import the attribution (the replays, predict, advise)
    or the commands: predictions and advice are computed by their commands (or by analyze) and stored
    (analysis.results), the views only draw them."""
    import ast
    from pathlib import Path

    views = Path(__file__).resolve().parent.parent / "analysis"
    found = []
    for path in sorted([*(views / "report").glob("*.py"), *(views / "merge").glob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            names += [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
            found += [
                f"{path.name}: {name}"
                for name in names
                if name.startswith(("analysis.attribution", "analysis.cli"))
            ]
    assert found == []
