"""docs/numbers.md names every figure summary.json carries: a field of the summary or of any struct
inside it is spelled there (a per-rank part's `_ms` may be left off: the parts are named bare)."""

from __future__ import annotations

import dataclasses
import re
import typing
from pathlib import Path

import msgspec

from analysis import schema

NUMBERS = Path(__file__).parent.parent / "docs" / "numbers.md"


def _fields(kind, seen: set) -> dict[str, str]:
    """field name -> the struct that holds it, over `kind` and every struct its fields hold."""
    origin = typing.get_origin(kind)
    if origin is not None:
        return {name: owner for arg in typing.get_args(kind) for name, owner in _fields(arg, seen).items()}
    structured = isinstance(kind, type) and (
        issubclass(kind, msgspec.Struct) or dataclasses.is_dataclass(kind)
    )
    if not structured or kind in seen:
        return {}
    seen.add(kind)
    found = {}
    for name, hint in typing.get_type_hints(kind, vars(schema)).items():
        found.setdefault(name, kind.__name__)
        found |= {k: v for k, v in _fields(hint, seen).items() if k not in found}
    return found


def test_every_summary_field_is_named_in_numbers_md():
    text = NUMBERS.read_text()

    def named(word: str) -> bool:
        return re.search(rf"\b{re.escape(word)}\b", text) is not None

    fields = _fields(schema.Summary, set())
    missing = {
        f"{owner}.{name}"
        for name, owner in fields.items()
        if not (named(name) or named(name.removesuffix("_ms")))
    }
    assert len(fields) > 100  # the walk reached the nested structs
    assert missing == set()
