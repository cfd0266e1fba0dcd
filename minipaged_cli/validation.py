"""One place that checks user-supplied numbers: finite, in range, whole where counts are meant.

Every reader (traces, presets, calibrations, sweep configs) and every option goes through these, so a NaN, an
infinity, a negative count or a fraction of a token is refused with one line naming the file, the field and the
value (``InputError``; exit 2 on the command line), never passed on to hang or crash the replay.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from minipaged_cli.errors import InputError

# The most tokens one count may hold: vLLM keeps token positions and sequence lengths in int32 (``seq_lens``, the
# block tables' positions), so no model is longer. A larger count is refused where it is read, before anything is
# sized by it (a list of its blocks' keys, an array of its lengths); one within it but longer than the model is a
# rejected request, as in vLLM.
MAX_INT32 = 2**31 - 1
MAX_TOKENS = MAX_INT32
# The most requests one generated group, or samples one request (``n``), may make: each is an object in memory,
# and the public traces hold some 30,000 requests in all.
MAX_REQUESTS = 1_000_000


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_finite(value: int | float) -> bool:
    """(``math.isfinite`` cannot take an int past a float's range: every int is finite.)"""
    return isinstance(value, int) or math.isfinite(value)


def finite_number(value: Any, *, field: str, source: str | None = None, where: str | None = None,
                  minimum: float | None = None, maximum: float | None = None,
                  exclusive_minimum: bool = False, exclusive_maximum: bool = False) -> float:
    """``value`` as a float: a finite number within [minimum, maximum] (``(minimum, ...`` and ``..., maximum)``
    when exclusive)."""

    def refuse(message: str) -> InputError:
        return InputError(message, source=source, where=where, field=field, value=value, has_value=True)

    if not _is_number(value) or not _is_finite(value) or abs(value) > sys.float_info.max:
        raise refuse("must be a finite number")
    if minimum is not None and (value < minimum or (exclusive_minimum and value == minimum)):
        raise refuse(f"must be {'>' if exclusive_minimum else '>='} {minimum:g}")
    if maximum is not None and (value > maximum or (exclusive_maximum and value == maximum)):
        raise refuse(f"must be {'<' if exclusive_maximum else '<='} {maximum:g}")
    return float(value)


def positive_number(value: Any, *, field: str, source: str | None = None, where: str | None = None) -> float:
    """A finite number > 0 (a time, a rate, a bandwidth)."""
    return finite_number(value, field=field, source=source, where=where, minimum=0.0, exclusive_minimum=True)


def whole_number(value: Any, *, field: str, source: str | None = None, where: str | None = None,
                 minimum: int | None = None, maximum: int | None = None) -> int:
    """``value`` as an int: a whole number (``600`` or ``600.0``; not ``12.5``, ``"600"`` or ``True``) within
    [minimum, maximum]."""

    def refuse(message: str) -> InputError:
        return InputError(message, source=source, where=where, field=field, value=value, has_value=True)

    if not _is_number(value) or not _is_finite(value) or (isinstance(value, float) and not value.is_integer()):
        raise refuse("must be a whole number")
    if minimum is not None and value < minimum:
        raise refuse(f"must be >= {minimum}")
    if maximum is not None and value > maximum:
        raise refuse(f"must be <= {maximum}")
    return int(value)


def token_count(value: Any, *, field: str, source: str | None = None, where: str | None = None,
                minimum: int = 1) -> int:
    """A whole number of tokens, at least ``minimum`` and at most ``MAX_TOKENS``."""
    if type(value) is int and minimum <= value <= MAX_TOKENS:  # (a trace's every length: no call per check)
        return value
    count = whole_number(value, field=field, source=source, where=where, minimum=minimum)
    if count > MAX_TOKENS:
        raise InputError(f"must be <= {MAX_TOKENS} (2**31 - 1: vLLM's token positions are int32)", source=source,
                         where=where, field=field, value=value, has_value=True)
    return count


def number_from_text(text: Any) -> Any:
    """A number written as text (a CSV cell): ``"374"`` -> 374, ``"2.5"`` -> 2.5, ``"nan"`` -> nan; anything else
    is returned unchanged, so that the checks above refuse it with the text as the user wrote it."""
    if not isinstance(text, str):
        return text
    for parse in (int, float):
        try:
            return parse(text)
        except ValueError:
            pass
    return text
