"""One reader for every YAML and JSON file a user hands the project: traces, model and GPU configs, calibrations,
sweep configs, Mooncake's JSON lines (and fleet files).

A mapping that repeats a key is refused, naming the file, the key and its line: PyYAML and ``json`` keep the last
value silently, so ``{output_tokens: 10, output_tokens: 5000}`` would run with 5,000. Whatever else cannot be read
(not text, bad syntax, an integer of more digits than Python converts, nesting deeper than the parser recurses)
is an ``InputError`` too: exit 2 with one line, never a traceback.
"""

from __future__ import annotations

import json
import json.decoder
import json.scanner
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import yaml

from minipaged_cli.errors import InputError

# libyaml parses a 1,000-request trace ~7x faster than PyYAML's pure-Python parser; the same documents.
_SAFE_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_MERGE_TAG = "tag:yaml.org,2002:merge"
# Nesting a YAML document may have: libyaml builds nodes by C recursion, and some 30,000 levels of ``[`` overflow
# its stack (a segfault, no exception to catch), so deeper documents are refused before they are built.
MAX_YAML_DEPTH = 1000
LIBYAML_TOO_DEEP = "exceeded maximum nesting depth"  # (libyaml's limit is 1000 levels too)


class DuplicateKeyError(ValueError):
    """A mapping that repeats ``key``: on ``line``, first on ``first_line`` (1-based; 0 where unknown)."""

    def __init__(self, key: Any, line: int, first_line: int) -> None:
        self.key = key
        self.line = line
        self.first_line = first_line
        super().__init__(f"duplicate key {key!r} on line {line} (first on line {first_line})")

    def input_error(self, source: str, where: str | None = None) -> InputError:
        """The error for the file ``source``; ``where``, when given, places the mapping instead of its lines."""
        first = f" (first on line {self.first_line})" if self.first_line and where is None else ""
        return InputError(f"duplicate key{first}; write each key once", source=source,
                          where=where or (f"line {self.line}" if self.line else None), field=str(self.key))


class UniqueKeyLoader(_SAFE_LOADER):  # type: ignore[valid-type, misc]
    """``yaml.safe_load``'s loader, refusing a mapping that repeats a key (``<<`` merges may still override)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        first_line: dict[Any, int] = {}
        for key_node, _ in node.value:
            if key_node.tag == _MERGE_TAG:
                continue
            key = self.construct_object(key_node, deep=True)
            try:
                seen = key in first_line
            except TypeError:  # unhashable: the constructor below refuses it
                continue
            line = key_node.start_mark.line + 1
            if seen:
                raise DuplicateKeyError(key, line, first_line[key])
            first_line[key] = line
        return super().construct_mapping(node, deep=deep)


def parse_yaml(text: str, source: str) -> Any:
    """The document in ``text`` (the safe loader, duplicate keys refused); ``source`` names it in errors."""
    try:
        if len(text) > MAX_YAML_DEPTH:  # (each level takes a character at least)
            _check_depth(text, source)
        return yaml.load(text, Loader=UniqueKeyLoader)
    except InputError:
        raise
    except DuplicateKeyError as error:
        raise error.input_error(source) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f"line {mark.line + 1}" if mark is not None else None
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise InputError(f"not valid YAML: {problem}", source=source, where=where) from None
    except (ValueError, ArithmeticError, RecursionError) as error:  # too many digits, a bad date, deep nesting
        raise InputError(f"not valid YAML: {_first_line(error)}", source=source) from None


def parse_json(text: str, source: str, where: str | None = None) -> Any:
    """The JSON value in ``text``, duplicate keys refused; ``where`` places ``text`` in its file (a JSONL line)."""
    try:
        if text.startswith("\ufeff"):  # (``json.loads``'s own refusal, which the shared decoder skips)
            raise json.JSONDecodeError("Unexpected UTF-8 BOM (decode using utf-8-sig)", text, 0)
        return _DECODER.decode(text)
    except DuplicateKeyError as repeat:
        raise (repeat if where is not None else _located(repeat, text)).input_error(source, where) from None
    except json.JSONDecodeError as error:
        raise InputError(f"not valid JSON: {error.msg}", source=source,
                         where=where or f"line {error.lineno}") from None
    except (ValueError, ArithmeticError, RecursionError) as error:  # too many digits, deep nesting
        raise InputError(f"not valid JSON: {_first_line(error)}", source=source, where=where) from None


def read_text(path: Path, *, field: str | None = None) -> str:
    """The file's text (UTF-8); bad input naming the file, and ``field`` (the option that gave it), when it cannot
    be read."""
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        reason = getattr(error, "strerror", None) if isinstance(error, OSError) else None
        raise InputError(f"cannot read: {reason or _first_line(error)}", source=str(path), field=field) from None


def read_json_lines(path: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """The JSON objects of a JSONL file, a line each (blank lines skipped), with where each is ("line 3"). Lines
    end at newlines only: a JSON string may hold U+2028 and the other separators ``str.splitlines`` cuts at."""
    source = str(path)
    scan = _DECODER.scan_once
    for line, text in enumerate(read_text(path).split("\n"), start=1):
        if not text.strip():
            continue
        where = f"line {line}"
        # A line that is one value, nothing around it (a trace's every line), is scanned as ``decode`` would scan
        # it, without its calls around the scanner; whatever else it holds is parsed by ``parse_json``, whose
        # answer, or refusal, it is.
        try:
            row, end = scan(text, 0)
        except Exception:  # (parse_json below says what is wrong, as for any other line)
            row, end = None, 0
        if end != len(text):
            row = parse_json(text, source, where)
        if not isinstance(row, dict):
            raise InputError("expected a JSON object", source=source, where=where)
        yield where, row


def read_yaml(path: Path, *, field: str | None = None) -> Any:
    """What the YAML file at ``path`` holds (``parse_yaml``)."""
    return parse_yaml(read_text(path, field=field), str(path))


def read_document(path: Path, *, field: str | None = None) -> Any:
    """What the file at ``path`` holds: JSON by its ``.json`` suffix, else YAML (``parse_json``, ``parse_yaml``)."""
    text = read_text(path, field=field)
    return parse_json(text, str(path)) if path.suffix == ".json" else parse_yaml(text, str(path))


def read_mapping(path: Path, expected: str, *, field: str | None = None) -> dict[str, Any]:
    """``read_document`` for a file that must hold a mapping of names; ``expected`` says of what, in the error."""
    document = read_document(path, field=field)
    if not isinstance(document, dict):
        raise InputError(f"expected a mapping {expected}", source=str(path))
    for key in document:
        if not isinstance(key, str):  # YAML's 1, null, true: no setting is named so
            raise InputError("a key must be text", source=str(path), value=key, has_value=True)
    return document


def _check_depth(text: str, source: str) -> None:
    """Refuse a document nested deeper than ``MAX_YAML_DEPTH``, from libyaml's events (its parser keeps a stack
    of its own: no recursion before the nodes are built). libyaml 0.2.6 (in PyYAML 6.0.4's wheels) refuses the same
    depth in its scanner, which reads ahead of the events: its refusal is this one too."""
    depth = 0
    try:
        for event in yaml.parse(text, Loader=_SAFE_LOADER):
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_YAML_DEPTH:
                    raise _too_deep(source, event.start_mark)
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
    except yaml.MarkedYAMLError as error:
        if error.problem != LIBYAML_TOO_DEEP:
            raise
        raise _too_deep(source, error.problem_mark) from None


def _too_deep(source: str, mark: yaml.Mark | None) -> InputError:
    return InputError(f"nested more than {MAX_YAML_DEPTH} levels deep", source=source,
                      where=None if mark is None else f"line {mark.line + 1}")


def _first_line(error: BaseException) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0]


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json``'s object hook: the object as a dict, or ``DuplicateKeyError`` (lines found afterwards)."""
    document = dict(pairs)
    if len(document) != len(pairs):
        key = next(k for i, (k, _) in enumerate(pairs) if any(k == other for other, _ in pairs[:i]))
        raise DuplicateKeyError(key, 0, 0)
    return document


# One decoder for every document: ``json.loads`` with a hook builds a decoder a call (a JSONL trace is a call a line)
_DECODER = json.JSONDecoder(object_pairs_hook=_unique_pairs)


def _located(repeat: DuplicateKeyError, text: str) -> DuplicateKeyError:
    """``repeat`` with its lines in ``text``, or without them where ``text`` nests too deep for the pure-Python
    scanner."""
    try:
        return _locate_duplicate(text)
    except RecursionError:
        return repeat


def _locate_duplicate(text: str) -> DuplicateKeyError:
    """Parse ``text`` again, slowly, through the pure-Python scanner recording where each value starts, so the
    error names the lines of the first repeated key (asked only once a repeat is known)."""
    found: list[DuplicateKeyError] = []

    def parse_object(s_and_end: tuple[str, int], strict: bool, scan_once: Callable[[str, int], Any],
                     object_hook: Any, object_pairs_hook: Any, memo: Any = None) -> tuple[Any, int]:
        starts: list[int] = []

        def recording(string: str, index: int) -> Any:
            starts.append(index)  # each value of this object (its nested objects parse through scan_once)
            return scan_once(string, index)

        pairs, end = json.decoder.JSONObject(s_and_end, strict, recording, None, list, memo)
        first: dict[str, int] = {}
        for (key, _), start in zip(pairs, starts, strict=True):
            line = text.count("\n", 0, start) + 1
            if key in first and not found:
                found.append(DuplicateKeyError(key, line, first[key]))
            first.setdefault(key, line)
        return dict(pairs), end

    decoder = json.JSONDecoder()
    decoder.parse_object = parse_object  # type: ignore[assignment]
    decoder.scan_once = json.scanner.py_make_scanner(decoder)  # (the C scanner never calls parse_object)
    decoder.decode(text)
    return found[0]
