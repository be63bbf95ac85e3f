"""The vocabulary (analysis.vocabulary) is the summary's: each typed struct spells its fields from it, and
in analysis/ each gap class, part and waterfall term is a string literal in the vocabulary alone."""

from __future__ import annotations

import re
from pathlib import Path

from analysis.schema import GAP_CLASSES, RANK_PARTS, Parts, Waterfall
from analysis.vocabulary import RUNGS, Effect, GapClass, Part

ANALYSIS = Path(__file__).resolve().parent.parent / "analysis"


def test_the_structs_spell_their_fields_from_the_vocabulary():
    assert Parts.__struct_fields__ == tuple(f"{part}_ms" for part in Part)
    assert Waterfall.__struct_fields__ == RUNGS
    assert GAP_CLASSES == tuple(GapClass) and RANK_PARTS == tuple(Part)
    assert set(GapClass) <= set(Part)  # the idle parts are the gap classes
    assert not {str(e) for e in Effect} & {str(p) for p in Part}  # no effect is spelled like a part


def test_no_gap_class_or_part_is_spelled_outside_the_vocabulary():
    words = {str(w) for w in (*GapClass, *Part)}
    literal = re.compile("|".join(rf'"{word}"' for word in sorted(words)))
    found = [
        f"{path.relative_to(ANALYSIS)}:{n}"
        for path in sorted(ANALYSIS.rglob("*.py"))
        if path.name != "vocabulary.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        if literal.search(line)
    ]
    assert found == []
