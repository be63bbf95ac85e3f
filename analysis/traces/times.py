"""Chrome-trace times (microseconds, JSON numbers) -> exact integer nanoseconds, as polars expressions.

msgspec hands each ts/dur over as an int or a float (analysis.traces.kineto, already range-checked). An int is
exact: us * 1000. A float is the double nearest the decimal text; split into whole and fraction it gives
the text's nanoseconds, rounded half up at the fourth decimal, unless the text's value may lie on the
other side of a half nanosecond from the double's. That is "unsettled": texts with more than three
decimals at a tie (0.0015), and, as a double's spacing grows with the value, fractional times past about
2**41 us (25 days after baseTimeNanoseconds). Unsettled rows are converted again from their JSON text
(`exact_ns`): "5110114341537.881" -> 5110114341537 * 1000 + 881. Exponent texts ("1.5e3") go through a
float there too, split into whole and fraction, exact wherever a float can be.

Kineto writes three decimals, and its ts sit ~5e12 us after its base time (59 days), past 2**41 but
below 2**43 us: there a double is within 0.49 ns of any decimal, so when every text names whole
nanoseconds (`whole_ns`: the caller checked there are no more than three decimals) the nearest integer
is the text's value and nothing is unsettled below 2**43 us.

A time written as a JSON string ("ts": "1234.5") is read as the number its text writes, by the same
text rule (`exact_ns`); a string that is no JSON number, or one out of range, is refused.
"""

from __future__ import annotations

import polars as pl

# Largest distance, in ns, between a double's value times 1000 and its decimal text's: half its
# spacing (at most |value| * 2**-52 us) plus the rounding of fraction * 1000.
_SPACING_NS_PER_US = 500 * 2.0**-52
_PRODUCT_ERROR_NS = 2e-13
# Below this many us a double's spacing is under 1 ns: half of it plus the product error is < 0.5 ns.
WHOLE_NS_LIMIT_US = 2.0**43
# JSON's number grammar: the texts a string time may hold
_JSON_NUMBER = r"^-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?$"


def nanoseconds(micros: pl.Series, whole_ns: bool = False) -> tuple[pl.Series, pl.Series]:
    """An Int64 or Float64 microsecond series -> (nanoseconds, positions of unsettled rows); nulls stay
    null. Unsettled rows must be converted again from their text (exact_ns). `whole_ns`: every text
    has at most three decimals."""
    if micros.dtype == pl.Int64:
        return micros * 1000, pl.Series(dtype=pl.UInt32)
    us = pl.col("us")
    whole = us.cast(pl.Int64)  # truncates toward zero; |us| < kineto.MAX_US fits
    fraction_ns = (us - whole.cast(pl.Float64)) * 1000
    below_ns = (fraction_ns - fraction_ns.cast(pl.Int64).cast(pl.Float64)).abs()
    if whole_ns:
        unsettled = us.abs() >= WHOLE_NS_LIMIT_US
    else:
        unsettled = (below_ns - 0.5).abs() <= us.abs() * _SPACING_NS_PER_US + _PRODUCT_ERROR_NS
    converted = pl.DataFrame({"us": micros}).select(
        ns=whole * 1000 + fraction_ns.round().cast(pl.Int64), unsettled=unsettled
    )
    return converted["ns"], converted["unsettled"].arg_true()


def exact_ns(column: str) -> pl.Expr:
    """Nanoseconds from a column of microsecond number texts; null where the text is empty."""
    text = pl.col(column)
    ns = pl.when(text.str.contains("[eE]")).then(_exponent_ns(text)).otherwise(_decimal_ns(text))
    return pl.when(text.str.len_bytes() > 0).then(ns).otherwise(None)


def string_problem(texts: pl.Series, limit_us: int) -> tuple[int, bool] | None:
    """The first of these times written as strings (null: a number, or none) that is no JSON number, or
    one not within +-`limit_us` (the range a number is checked against), and whether it is a number;
    else None. Those that pass are read by `exact_ns`, as a number's text is."""
    found = pl.DataFrame({"t": texts}).select(
        number=pl.col("t").str.contains(_JSON_NUMBER),
        inside=pl.col("t").cast(pl.Float64, strict=False).abs() < limit_us,
    )
    for bad, number in ((~found["number"], False), (~found["inside"], True)):
        rows = bad.fill_null(False).arg_true()
        if rows.len():
            return rows[0], number
    return None


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


def missing_time(
    index: pl.Series, ph: pl.Series, name: pl.Series, ts: pl.Series, dur: pl.Series
) -> str | None:
    """The first event missing a time it needs, as one line; else None. Every event but metadata ("M")
    needs a ts; complete events ("X") need a dur. (Types and ranges were checked while decoding.)"""
    for bad, problem in (
        (ts.is_null() & (ph != "M"), "missing ts"),
        (dur.is_null() & (ph == "X"), "complete event (ph X) without dur"),
    ):
        if bad.any():
            row = bad.arg_true()[0]
            return f"event {index[row]} ({ph[row]} {name[row][:60]!r}): {problem}"
    return None
