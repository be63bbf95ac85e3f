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
