"""cli/common.py's consoles: the highlighter runs where its colours show, and is off where they would print nothing."""

from __future__ import annotations

import io

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.console import Console

from minipaged_cli.cli.common import _console

# Text as the tables' header lines hold it: numbers, units, names, quotes, parentheses, None/True ("[" is markup).
HEADER_TEXT = st.text(alphabet="0123456789 .,:/-·=x()'\"abcdefNoneTrueFalsehttp://GiB", max_size=80)


@given(text=HEADER_TEXT)
def test_without_colours_the_highlighter_prints_nothing(text: str) -> None:
    plain, highlighted = io.StringIO(), io.StringIO()
    Console(file=plain, width=150, highlight=False).print(text)
    Console(file=highlighted, width=150, highlight=True).print(text)
    assert highlighted.getvalue() == plain.getvalue()


@pytest.mark.parametrize("to_stderr", [False, True])
def test_a_console_highlights_where_colours_show(to_stderr: bool, monkeypatch: pytest.MonkeyPatch,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("FORCE_COLOR", "1")
    _console(to_stderr).print("12 requests")
    monkeypatch.delenv("FORCE_COLOR")
    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    _console(to_stderr).print("12 requests")  # captured: not a terminal
    captured = capsys.readouterr()
    first, second = (captured.err if to_stderr else captured.out).splitlines()
    assert "\x1b[" in first and "12" in first  # the number in its colour
    assert second == "12 requests"
