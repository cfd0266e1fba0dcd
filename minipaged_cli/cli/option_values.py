"""Option values converted without pydantic: a text, a whole number, a decimal number or a path, as Typer converts
them, without building a pydantic ``TypeAdapter`` for each option.

Typer 0.29 converts every option's value, its default included, through a pydantic ``TypeAdapter`` built for that
option the first time it is read: for simulate's 54 options that is pydantic's import and 54 schemas, more than the
replay of a short trace costs. The values a command line or a settings file usually gives are plain: a string, or
digits as Python's ``int`` and ``float`` read them exactly as pydantic does. ``PlainValue`` converts those itself and
hands every other value (``" 5"``, ``"1_000"``, ``"inf"``, a YAML number for a text option, a number out of the
option's range, a bad value) to Typer's own conversion, so results and error messages are Typer's.

Invariant: for every value, ``PlainValue`` returns what Typer's conversion returns or raises what it raises
(``tests/cli/test_option_values.py`` checks it against Typer over generated values).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typer._coercion import RuntimeParam, TypeDescriptor, build_runtime_param
from typer._param_types import coerce_cli_path

# Digits that ``int`` and ``float`` read as pydantic does; pydantic also takes signs, spaces, underscores, "inf",
# "5.0" as an int (these go to Typer). ``[0-9]`` is ASCII alone: both ``int`` and ``float`` also read other digits.
_INT = re.compile(r"-?[0-9]{1,18}")
_FLOAT = re.compile(r"-?(?:[0-9]{1,18}(?:\.[0-9]{0,18})?|\.[0-9]{1,18})(?:[eE]-?[0-9]{1,2})?")
_NOT_PLAIN = object()


def _plain(annotation: Any, value: Any) -> Any:
    """``value`` converted to ``annotation`` when it is plain, else ``_NOT_PLAIN``."""
    if annotation is str:
        return value if type(value) is str else _NOT_PLAIN
    if annotation is int:
        if type(value) is int:
            return value
        return int(value) if type(value) is str and _INT.fullmatch(value) else _NOT_PLAIN
    if annotation is float:
        if type(value) in (float, int):
            return float(value)
        return float(value) if type(value) is str and _FLOAT.fullmatch(value) else _NOT_PLAIN
    if annotation is Path:  # pydantic's Path(value); Typer's message for a path that Path rewrites (a//b/), and
        # for a null byte (os.stat's ValueError, which pydantic words)
        plain = type(value) is str and "\0" not in value and str(Path(value)) == value
        return Path(value) if plain else _NOT_PLAIN
    return _NOT_PLAIN


def _in_range(value: Any, descriptor: TypeDescriptor) -> bool:
    info = descriptor.parameter_info
    if info.clamp:
        return False
    return (info.min is None or value >= info.min) and (info.max is None or value <= info.max)


@dataclass(frozen=True)
class PlainValue(RuntimeParam):
    """Typer's conversion of one option, with plain values converted without pydantic."""

    descriptor: TypeDescriptor

    def _coerce_value(self, value: Any, param: Any, ctx: Any) -> Any:
        plain = _plain(self.annotation, value)
        if plain is _NOT_PLAIN or not _in_range(plain, self.descriptor):
            return build_runtime_param(self.descriptor)._coerce_value(value, param=param, ctx=ctx)
        if self.annotation is Path:  # then Typer's checks of the path (exists, readable, ...) and its messages
            return coerce_cli_path(plain, self.parameter_info, path_type=Path, param=param, ctx=ctx)
        return plain


def _of_plain_type(descriptor: TypeDescriptor) -> bool:
    """One value of str, int, float, Path or bool (a flag's own True or False Typer converts itself), with no
    conversion of its own (a parser, choices, a file to open, another path type)."""
    info = descriptor.parameter_info
    return (descriptor.annotation in (str, int, float, Path, bool) and not descriptor.is_file
            and not descriptor.is_choice and info.parser is None and info.path_type is None)


def convert_plainly(params: list[Any]) -> list[Any]:
    """``params`` (Typer's), each of a plain type converting its values with ``PlainValue`` from now on."""
    for param in params:
        descriptor = getattr(param, "type_descriptor", None)
        try:
            if descriptor is None or param._runtime_param is not None or not _of_plain_type(descriptor):
                continue
            param._runtime_param = PlainValue(parameter_info=descriptor.parameter_info,
                                              annotation=descriptor.annotation, descriptor=descriptor)
        except (AttributeError, TypeError):  # a Typer whose internals moved: its own conversion throughout
            return params
    return params
