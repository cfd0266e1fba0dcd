"""The one error type that means "the user's input is wrong" (exit code 2 on the command line), and the hint
such errors give."""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any


def did_you_mean(word: str, options: Iterable[Any], cutoff: float = 0.6) -> str:
    """' (did you mean 'x'?)' for the option closest to ``word``, or '' when none is close."""
    close = difflib.get_close_matches(word, [str(option) for option in options], n=1, cutoff=cutoff)
    return f" (did you mean {close[0]!r}?)" if close else ""


class InputError(ValueError):
    """Bad input: says where (file, request, field), what value, and what to do.

    The CLI prints ``str(error)`` as one line and exits with code 2; the library raises it wherever
    user-supplied data (a trace, a preset, an option) cannot be used.
    """

    def __init__(
        self,
        message: str,
        *,
        source: str | None = None,
        where: str | None = None,
        field: str | None = None,
        value: Any = None,
        has_value: bool = False,
    ) -> None:
        self.source = source
        self.where = where
        self.field = field
        self.value = value
        self.has_value = has_value
        self.message = message
        super().__init__(self._line())

    def _line(self) -> str:
        parts = [p for p in (self.source, self.where, self.field) if p]
        if self.has_value:
            parts.append(repr(self.value))
        parts.append(self.message)
        return ": ".join(map(_one_line, parts))


def _one_line(part: object) -> str:
    """``part`` as text, its line breaks escaped (a key written as "a\\nb" in a file): the error stays one line."""
    text = str(part)
    return text if len(f".{text}.".splitlines()) == 1 else repr(text)[1:-1]
