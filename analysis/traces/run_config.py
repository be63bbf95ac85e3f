"""run.json, the configuration our runners write beside a run's traces: read within its size limit,
refused when the run is incomplete, its calibration checked once for every reader."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from analysis.errors import InputError
from analysis.traces import limits
from analysis.traces.run_files import RUNNER_LOG
from runners.rundir import incomplete_reason
from analysis.traces.source import read_text
from analysis.traces.toplevel import NESTED_TOO_DEEPLY


def read_run_config(path: Path) -> dict[str, Any] | None:
    """run.json as a dict; None when absent (traces our runners did not write). A run.json without
    `"complete": true`, or none beside the launcher's log, is a run stopped, failed or in progress, which
    the refusal says (runners.rundir.incomplete_reason)."""
    ours = path.with_name(RUNNER_LOG).exists()
    if not path.exists():
        if ours:
            raise InputError(path.parent, f"incomplete run: {incomplete_reason(path.parent)}")
        return None
    try:
        config = msgspec.json.decode(read_text(path, limits.RUN_JSON_BYTES).data)
    except (msgspec.DecodeError, RecursionError) as error:
        problem = NESTED_TOO_DEEPLY if isinstance(error, RecursionError) else error
        raise InputError(path, f"unreadable run.json: {problem}") from None
    if not isinstance(config, dict):
        raise InputError(path, "run.json is not a JSON object")
    if config.get("complete") is not True:
        why = incomplete_reason(path.parent) if ours else 'run.json lacks "complete": true (interrupted or running)'
        raise InputError(path, f"incomplete run: {why}")
    _check_calibration(path, config.get("calibration"), config.get("calibration_by_rows"))
    return config


def _check_calibration(path: Path, calibration: Any, by_rows: Any) -> None:
    """Stage index text -> {"F_ms": ms, "B_ms": ms, ...} with every time > 0, or absent, and the same per
    row count in calibration_by_rows: checked here once, so the waterfall, the report, `predict` and the
    merge's ideal track never meet a malformed one."""

    def times(where: str, entry: Any) -> None:
        if not isinstance(entry, dict) or not {"F_ms", "B_ms"} <= entry.keys():
            raise InputError(path, f"bad {where}: needs F_ms, B_ms")
        for key, ms in entry.items():
            if isinstance(ms, bool) or not isinstance(ms, (int, float)) or not ms > 0:
                raise InputError(path, f"bad {where}: {key!r:.40} = {ms!r:.40} is not a time > 0")

    def per_rows(where: str, entry: Any) -> None:
        _check_keyed(path, where, "row count", entry, lambda count: f"{where} rows {count}", times)

    if calibration is not None:
        _check_keyed(
            path, "calibration", "stage", calibration, lambda stage: f"calibration: stage {stage}", times
        )
    if by_rows is not None:
        _check_keyed(
            path,
            "calibration_by_rows",
            "stage",
            by_rows,
            lambda s: f"calibration_by_rows: stage {s}",
            per_rows,
        )


def _check_keyed(
    path: Path, name: str, key: str, table: Any, where: Callable[[str], str], check: Callable
) -> None:
    """`table` an object of integer text (a stage, a row count) -> an entry `check` accepts."""
    if not isinstance(table, dict):
        raise InputError(path, f"bad {name}: not an object of {key} -> times")
    for index, entry in table.items():
        if not (index.isascii() and index.isdecimal()):
            raise InputError(path, f"bad {name}: {key} {index!r:.40} is not an integer")
        check(where(index), entry)
