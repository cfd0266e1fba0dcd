"""The shell examples of README.md and docs/ marked runnable: run each command and check what the page shows against
what it prints (or, with --write, rewrite what the page shows).

A runnable example is a ```console block right after a line ``<!-- runnable -->``. Its first line is
``$ minipaged ...`` (a trailing backslash continues it); the rest is what the command prints on stdout, whole or an
excerpt. Each line shown must match a line printed, in order (lines may be left out), with the same text and every
number equal as printed. The marker may add, after a semicolon:

- ``ignore: WORDS, ...``: leave out the lines that contain any of these words (timings, which vary by machine);
- ``tolerance: X``: numbers may differ by X relatively (a page rounded by hand says how much).

    python scripts/runnable_examples.py            # check every example; exit 1 on a mismatch
    python scripts/runnable_examples.py --write    # rewrite the examples that do not match from what is printed

The commands run in this process through Typer's CliRunner, from the repository's root, with the tables 150
columns wide (what a pipe gets)."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MARKER = re.compile(r"^<!-- runnable(?P<options>;[^>]*)? -->\n```console\n(?P<body>.*?)^```\n", re.M | re.S)
NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:e[-+]?\d+)?")
WIDTH = 150


@dataclass
class Example:
    path: Path
    start: int  # offset of the block's body in the page
    end: int
    command: str
    shown: list[str]
    ignore: tuple[str, ...] = ()
    tolerance: float = 0.0
    args: list[str] = field(default_factory=list)

    @property
    def where(self) -> str:
        return where(self.path, self.start)


def where(path: Path, start: int) -> str:
    """The page and line of the offset ``start`` in it."""
    line = path.read_text()[:start].count("\n") + 1
    return f"{path.relative_to(ROOT)}:{line}"


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def marker_options(match: re.Match[str]) -> dict[str, str]:
    """The options a block's marker gives after its semicolons (``name: value`` or a bare ``name``)."""
    return dict(_option(part) for part in (match["options"] or "").split(";") if part.strip())


def command_and_output(body: str) -> tuple[str, list[str]]:
    """A console block's command (its ``$`` line, continued by trailing backslashes) and the lines after it."""
    lines = body.splitlines()
    command_lines = []
    while lines:
        line = lines.pop(0)
        command_lines.append(line.removeprefix("$ ").rstrip("\\").strip())
        if not line.rstrip().endswith("\\"):
            break
    return " ".join(command_lines), lines


def block_body(command: str, printed: str) -> str:
    """A console block's body: the command, wrapped, then what it printed."""
    return _wrapped("$ " + command) + "\n" + "\n".join(line.rstrip() for line in printed.rstrip().splitlines()) + "\n"


def examples(path: Path) -> list[Example]:
    """The runnable examples of one page."""
    text = path.read_text()
    found = []
    for match in MARKER.finditer(text):
        options = marker_options(match)
        command, lines = command_and_output(match["body"])
        if not command.startswith("minipaged "):
            raise ValueError(f"{path}: a runnable example must start with '$ minipaged': {command!r}")
        ignore = tuple(w.strip() for w in options.get("ignore", "").split(",") if w.strip())
        found.append(Example(path, match.start("body"), match.end("body"), command, lines, ignore,
                             float(options.get("tolerance", 0)), shlex.split(command)[1:]))
    return found


def _option(part: str) -> tuple[str, str]:
    name, _, value = part.strip().partition(":")
    return name.strip(), value.strip()


def run(example: Example) -> str:
    """What the command prints on stdout."""
    from typer.testing import CliRunner

    from minipaged_cli.cli import common
    from minipaged_cli.cli.main import app

    common.stdout.width = common.stderr.width = WIDTH
    previous = Path.cwd()
    os.chdir(ROOT)
    try:
        result = CliRunner().invoke(app, example.args)
    finally:
        os.chdir(previous)
    if result.exit_code != 0:
        raise RuntimeError(f"{example.where}: '{example.command}' exited {result.exit_code}: "
                           f"{(result.stderr or result.output).strip()[-500:]}")
    return result.stdout


def _kept(lines: list[str], ignore: tuple[str, ...]) -> list[str]:
    return [line.rstrip() for line in lines if line.strip() and not any(word in line for word in ignore)]


def _skeleton(line: str) -> str:
    return " ".join(NUMBER.sub("#", line).split())


def _numbers_match(shown: str, printed: str, tolerance: float) -> bool:
    for a, b in zip(NUMBER.findall(shown), NUMBER.findall(printed), strict=True):
        if a == b:
            continue
        x, y = float(a.replace(",", "")), float(b.replace(",", ""))
        if abs(x - y) > tolerance * max(abs(x), abs(y)):
            return False
    return True


def mismatches(example: Example, printed: str) -> list[str]:
    """Why the page's lines do not match what was printed; [] when they do."""
    shown = _kept(example.shown, example.ignore)
    actual = _kept(printed.splitlines(), example.ignore)
    if not shown:
        return [f"{example.where}: no output shown (python scripts/runnable_examples.py --write fills it in)"]
    position = 0
    for line in shown:
        for i in range(position, len(actual)):
            if _skeleton(actual[i]) == _skeleton(line):
                if not _numbers_match(line, actual[i], example.tolerance):
                    return [f"{example.where}: the page shows\n    {line}\n  the command prints\n    {actual[i]}"]
                position = i + 1
                break
        else:
            return [f"{example.where}: the command prints no line like\n    {line}"]
    return []


def write(path: Path) -> int:
    """Rewrite the output of the runnable examples of one page that do not match (an excerpt that still matches
    stays as it is; one that does not becomes the whole output, to cut again); how many changed."""
    text = path.read_text()
    changed = 0
    for example in reversed(examples(path)):
        printed = run(example)
        if not mismatches(example, printed):
            continue
        body = block_body(example.command, printed)
        if text[example.start:example.end] != body:
            text = text[:example.start] + body + text[example.end:]
            changed += 1
    if changed:
        path.write_text(text)
    return changed


def _wrapped(command: str, width: int = 110) -> str:
    """A long command over several lines, broken before options, each line continued by a backslash."""
    lines = [""]
    for i, part in enumerate(command.split(" --")):
        piece = part if i == 0 else "--" + part
        if lines[-1] and len(lines[-1]) + len(piece) + 3 > width:
            lines.append("    " + piece)
        else:
            lines[-1] += (" " if lines[-1] else "") + piece
    return " \\\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help="rewrite the examples' output")
    args = parser.parse_args()
    failures = []
    for path in pages():
        if args.write:
            if write(path):
                print(f"wrote {path.relative_to(ROOT)}")
            continue
        for example in examples(path):
            failures += mismatches(example, run(example))
    for failure in failures:
        print(failure, file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
