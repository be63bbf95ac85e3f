"""The merge reads the ranks twice, one at a time (analysis.merge.sources): it holds one rank's trace while
writing, writes what the merge of the traces held whole gives, byte for byte, and says the size first."""

from __future__ import annotations

import contextlib
import gzip
import shutil
import weakref

import msgspec
import pytest

from analysis import results
from analysis.cli import main
from analysis.merge import merged, sources
from analysis.merge.merged import merge
from analysis.merge.sources import read_ranks
from runners.schedules import build
from synthetic import generate as synthetic

MS = 1_000_000
OFFSETS = {0: 0, 1: 4 * MS, 2: -5 * MS, 3: 1_234_567}


@pytest.fixture
def run(tmp_path):
    directory = tmp_path / "run"
    synthetic.write_run(directory, build("gpipe", 4, 4), clock_offset_ns=OFFSETS, steps=3)
    return directory


@pytest.mark.parametrize("stored", [True, False], ids=["analysis-stored", "analysed-by-the-merge"])
def test_one_rank_s_text_is_held_at_a_time(run, monkeypatch, stored):
    if stored:
        assert main(["analyze", str(run)]) == 0
    alive: list[weakref.ref] = []
    read = sources.read_trace

    def reading(path, *args, **kwargs):
        trace = read(path, *args, **kwargs)
        if kwargs.get("keep_text", True):  # read to be written; the first pass reads no text
            assert [ref for ref in alive if ref() is not None] == []
            alive.append(weakref.ref(trace))
        return trace

    monkeypatch.setattr(sources, "read_trace", reading)
    assert main(["merge", str(run)]) == 0
    assert len(alive) == 4


@pytest.mark.parametrize("chosen", [[], ["--steps", "1-2"], ["--ranks", "1,3"], ["--no-align"]])
def test_the_file_is_the_merge_of_the_traces_held_whole(run, tmp_path, chosen):
    assert main(["analyze", str(run)]) == 0
    out = tmp_path / "merged.json.gz"
    assert main(["merge", str(run), "--out", str(out), *chosen]) == 0
    steps = (1, 2) if "--steps" in chosen else None
    ranks = (1, 3) if "--ranks" in chosen else None
    whole = merge(read_ranks(run, ranks), steps, results.read(run), align="--no-align" not in chosen)
    assert gzip.decompress(out.read_bytes()) == msgspec.json.encode(whole)


def test_the_size_is_said_before_the_file_is_written(run, tmp_path, monkeypatch, capsys):
    out = tmp_path / "merged.json.gz"
    said = []
    opened = merged.atomic_file

    @contextlib.contextmanager
    def opening(path):
        said.append(capsys.readouterr().out)
        with opened(path) as file:
            yield file

    monkeypatch.setattr(merged, "atomic_file", opening)
    assert main(["merge", str(run), "--out", str(out)]) == 0
    assert said[0].startswith(f"writing {out}: about ")
    estimate = float(said[0].split("about ")[1].split(" MB")[0])
    written = len(gzip.decompress(out.read_bytes())) / 1e6
    assert 0.5 * written <= estimate <= 2 * written


def test_a_file_changed_between_its_reads_is_one_line_and_no_file(run, tmp_path, monkeypatch, capsys):
    assert main(["analyze", str(run)]) == 0
    out = tmp_path / "merged.json.gz"
    planned = merged.plan

    def swapping(*args, **kwargs):
        shutil.copy(run / "rank0.json.gz", run / "rank1.json.gz")  # after the first pass read rank 1
        return planned(*args, **kwargs)

    monkeypatch.setattr(merged, "plan", swapping)
    assert main(["merge", str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err == f"error: {run / 'rank1.json.gz'}: changed while it was merged: it was rank 1, now 0"
    assert not out.exists() and list(tmp_path.glob("*merged*")) == []
