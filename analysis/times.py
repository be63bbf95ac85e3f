"""Chrome-trace times (JSON number text in microseconds) -> exact integer nanoseconds, as polars expressions.

A float cannot hold Kineto's timestamps to the nanosecond once `ts` passes 2**43 us (about 100 days
after baseTimeNanoseconds, which is near boot time), so plain decimals are split at the point as text:
"5110114341537.881" -> 5110114341537 * 1000 + 881. Digits past the third decimal round half up.
Exponent forms ("1.5e3", as Python writes tiny or huge floats) go through a float, split into whole
and fraction so the result is exact wherever a float can be.
"""

from __future__ import annotations

import polars as pl

# |ts| below this many microseconds (about 127 years): base + ts then fits in int64 nanoseconds.
MAX_US = 4 * 10**15

_NUMBER = r"^-?[0-9]"


def _missing(column: str) -> pl.Expr:
    return pl.col(column).is_in(["", "null"])


def _decimal_ns(text: pl.Expr) -> pl.Expr:
    body = text.str.strip_prefix("-").str.split_exact(".", 1)
    whole = body.struct.field("field_0").cast(pl.Int64, strict=False)
    fraction = body.struct.field("field_1").fill_null("")
    milli = (fraction + "000").str.slice(0, 3).cast(pl.Int64, strict=False)
    round_up = (fraction.str.slice(3, 1) >= "5").cast(pl.Int64)
    magnitude = whole * 1000 + milli + round_up
    return pl.when(text.str.starts_with("-")).then(-magnitude).otherwise(magnitude)


def _exponent_ns(text: pl.Expr) -> pl.Expr:
    value = text.cast(pl.Float64, strict=False)
    whole = value.floor()
    return whole.cast(pl.Int64, strict=False) * 1000 + ((value - whole) * 1000).round().cast(pl.Int64)


def _in_range(column: str) -> pl.Expr:
    text = pl.col(column)
    value = text.cast(pl.Float64, strict=False).abs()
    return value < MAX_US


def exact_ns(column: str) -> pl.Expr:
    """Nanoseconds from a column of microsecond number texts; null where missing or not a number."""
    text = pl.col(column)
    usable = text.str.contains(_NUMBER) & _in_range(column)
    ns = pl.when(text.str.contains("[eE]")).then(_exponent_ns(text)).otherwise(_decimal_ns(text))
    return pl.when(usable).then(ns).otherwise(None)


def check_times(frame: pl.DataFrame) -> str | None:
    """The first event whose ts/dur is missing, not a number or out of range, as one line; else None.

    `frame` has columns index, ph, name, ts_text, dur_text. Every event but metadata ("M") needs a ts;
    complete events ("X") need a dur.
    """
    rules = [
        (~_missing("ts_text") & ~pl.col("ts_text").str.contains(_NUMBER), "ts is not a number"),
        (~_missing("dur_text") & ~pl.col("dur_text").str.contains(_NUMBER), "dur is not a number"),
        (_missing("ts_text") & (pl.col("ph") != "M"), "missing ts"),
        (_missing("dur_text") & (pl.col("ph") == "X"), "complete event (ph X) without dur"),
        (pl.col("ts_text").str.contains(_NUMBER) & ~_in_range("ts_text"), f"ts out of range (|ts| >= {MAX_US} us)"),
        (pl.col("dur_text").str.contains(_NUMBER) & ~_in_range("dur_text"), f"dur out of range (>= {MAX_US} us)"),
    ]
    for bad, problem in rules:
        first = frame.filter(bad).head(1)
        if first.height:
            row = first.row(0, named=True)
            shown = row["ts_text"] if problem.startswith("ts") else row["dur_text"]
            return f"event {row['index']} ({row['ph']} {row['name'][:60]!r}): {problem}: {shown[:40]!r}"
    return None
