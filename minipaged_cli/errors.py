"""The one error type that means "the user's input is wrong" (exit code 2 on the command line), and the hint
such errors give.

The library names the setting that was wrong, never a command-line flag: a ``field`` that is a setting is written
``{max_num_seqs}`` (a file's field is written as it is: ``pools[0].name``), and a message refers to a setting as
``{name}`` or ``{name=value}``. The CLI renders those as its flags (``cli/flags.py``: ``--max-num-seqs``,
``--scheduler v0``); the library's ``str(error)`` as the names (``max_num_seqs``, ``scheduler=v0``)."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable
from typing import Any

# A setting referred to in a message: {name} or {name=value} (a value without braces).
SETTING_REFERENCE = re.compile(r"\{([a-z][a-z0-9_]*)(?:=([^{}]+))?\}")

# How a reference reads: (setting, value or None) -> text.
Namer = Callable[[str, str | None], str]


def setting_name(setting: str, value: str | None) -> str:
    """A reference as the library writes it: ``max_num_seqs``, ``scheduler=v0``."""
    return setting if value is None else f"{setting}={value}"


def name_settings(text: str, namer: Namer = setting_name) -> str:
    """``text`` with each ``{setting}`` / ``{setting=value}`` reference written by ``namer``."""
    return SETTING_REFERENCE.sub(lambda match: namer(match[1], match[2]), text)


def did_you_mean(word: str, options: Iterable[Any], cutoff: float = 0.6) -> str:
    """' (did you mean 'x'?)' for the option closest to ``word``, or '' when none is close."""
    close = difflib.get_close_matches(word, [str(option) for option in options], n=1, cutoff=cutoff)
    return f" (did you mean {close[0]!r}?)" if close else ""


class InputError(ValueError):
    """Bad input: says where (file, request, field), what value, and what to do.

    The CLI prints ``line(its namer)`` as one line and exits with code 2; the library raises it wherever
    user-supplied data (a trace, a preset, a setting) cannot be used. ``message`` keeps its ``{setting}``
    references, so that an error re-raised under a file's name still names its settings.
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
        super().__init__(self.line())

    def line(self, namer: Namer = setting_name) -> str:
        """The error as one line, its settings named by ``namer``."""
        field = name_settings(self.field, namer) if self.field else None
        parts = [p for p in (self.source, self.where, field) if p]
        if self.has_value:
            parts.append(repr(self.value))
        parts.append(name_settings(self.message, namer))
        return ": ".join(map(_one_line, parts))


def _one_line(part: object) -> str:
    """``part`` as text, its line breaks escaped (a key written as "a\\nb" in a file): the error stays one line."""
    text = str(part)
    return text if len(f".{text}.".splitlines()) == 1 else repr(text)[1:-1]
