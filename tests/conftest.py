"""Inputs the tests share: real Kineto traces nobody on this project wrote, kept in tests/data/real-traces
(each file's repository, commit, licence and trimming in its PROVENANCE.md), and the place for real GPU
pipeline runs. Test modules import these names (`from conftest import REAL_TRACES`), as they import the
trace builders from test_cells.
"""

from __future__ import annotations

import gzip
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
REAL_TRACES = DATA / "real-traces"
# Every real trace file, for the tests that hold for all of them (the loader, the merge).
REAL_FILES = sorted(REAL_TRACES.rglob("*.json.gz"))
# Run directories (run.json + one trace per rank) from scripts/gpu_check.sh on a CUDA machine.
PIPELINE_GPU = DATA / "pipeline_gpu"


def real_id(path: Path) -> str:
    """A real trace's test id: its path under tests/data/real-traces."""
    return str(path.relative_to(REAL_TRACES))


def real_traces_in(folder: str) -> list[Path]:
    """The trace files of one folder under tests/data/real-traces; a folder that is missing or empty is
    an error, not an empty list, so a test cannot pass by looping over nothing."""
    found = sorted((REAL_TRACES / folder).glob("*.json.gz"))
    if not found:
        raise FileNotFoundError(f"no *.json.gz traces in {REAL_TRACES / folder}")
    return found


def gunzipped(path: Path) -> bytes:
    """A .json.gz file's JSON text."""
    return gzip.decompress(path.read_bytes())
