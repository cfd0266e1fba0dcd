"""The study pages' figures: run the command above each output block marked as written by this script, and replace
the block's output with what the command prints.

A study block is a ```console block right after a line ``<!-- study: written by scripts/study_pages.py -->``. Its
first line is ``$ minipaged ...`` (or ``$ python ...``, run with this Python; a trailing backslash continues it); the
rest is what the command printed on stdout (the whole of it, as this script wrote it). The marker may add, after a
semicolon:

- ``check``: the command is fast (a few seconds), so the test suite re-runs it and compares, as it does the runnable
  examples (``tests/project/test_docs.py``); the other blocks are too slow for a test run, and the test checks only that
  their command still parses;
- ``ignore: WORDS, ...``: for a checked block, leave out the lines that contain any of these words.

The commands run from the repository's root (the traces in ``../shared/traces`` are the public ones its README names),
each in its own process, with the tables 150 columns wide. A command that writes a picture (``--plot``,
``--plot-layout``) writes it where the page shows it.

    python scripts/study_pages.py                                  # every study block of every page
    python scripts/study_pages.py --only docs/studies/vllm-paper.md  # one page (or --only vllm-paper)
    python scripts/study_pages.py --list                           # the blocks and their commands, nothing run
    python scripts/study_pages.py --jobs 2                         # commands of a page in parallel
    python scripts/study_pages.py --only vllm-paper --match opt-13b  # the blocks whose command contains a text"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
from runnable_examples import block_body, command_and_output, marker_options, where  # noqa: E402

SCRIPT = "scripts/study_pages.py"
MARKER = re.compile(r"^<!-- study: written by scripts/study_pages\.py(?P<options>;[^>]*)? -->\n```console\n"
                    r"(?P<body>.*?)^```\n", re.M | re.S)
# Pages whose figures this script writes (and the test holds to it).
PAGES = ("docs/studies/*.md", "docs/concepts/step-times.md", "docs/concepts/layouts.md")
WIDTH = 150


@dataclass
class Block:
    path: Path
    start: int  # offset of the block's body in the page
    end: int
    command: str
    shown: list[str]
    options: dict[str, str]

    @property
    def args(self) -> list[str]:
        return shlex.split(self.command)[1:]

    @property
    def checked(self) -> bool:
        return "check" in self.options

    @property
    def ignore(self) -> tuple[str, ...]:
        return tuple(w.strip() for w in self.options.get("ignore", "").split(",") if w.strip())

    @property
    def where(self) -> str:
        return where(self.path, self.start)


def pages() -> list[Path]:
    found: list[Path] = []
    for pattern in PAGES:
        found += sorted(ROOT.glob(pattern))
    return found


def blocks(path: Path) -> list[Block]:
    """The study blocks of one page."""
    text = path.read_text()
    found = []
    for match in MARKER.finditer(text):
        options = marker_options(match)
        command, lines = command_and_output(match["body"])
        if not command.startswith(("minipaged ", "python ")):
            raise ValueError(f"{path}: a study block must start with '$ minipaged' or '$ python': {command!r}")
        found.append(Block(path, match.start("body"), match.end("body"), command, lines, options))
    return found


def run(block: Block, timeout: float | None = None) -> str:
    """What the command prints on stdout (run in its own process from the repository's root)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
           "COLUMNS": str(WIDTH), "TERM": "dumb"}
    program = [sys.executable, "-m", "minipaged_cli"] if block.command.startswith("minipaged ") else [sys.executable]
    done = subprocess.run([*program, *block.args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{block.where}: '{block.command}' exited {done.returncode}: "
                           f"{(done.stderr or done.stdout).strip()[-800:]}")
    return done.stdout


_LOCK = threading.Lock()


def write(path: Path, jobs: int = 1, timeout: float | None = None, match: str = "") -> int:
    """Run every study block of one page (those whose command contains `match`) and write what each printed, each
    block as soon as its command is done; how many blocks were written."""
    found = [block for block in blocks(path) if match in block.command]

    def one(block: Block) -> None:
        began = time.monotonic()
        print(f"{block.where}: {block.command}", file=sys.stderr, flush=True)
        printed = run(block, timeout)
        print(f"{block.where}: done in {time.monotonic() - began:.0f} s", file=sys.stderr, flush=True)
        with _LOCK:  # (the page as it is now: the other blocks may have been written meanwhile)
            text = path.read_text()
            current = next(b for b in blocks(path) if b.command == block.command)
            path.write_text(text[:current.start] + block_body(current.command, printed) + text[current.end:])

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        list(pool.map(one, found))
    return len(found)


def _page(name: str) -> Path:
    candidates = [p for p in pages() if str(p.relative_to(ROOT)) == name or p.stem == name or p.name == name
                  or p == Path(name).resolve()]
    if not candidates:
        raise SystemExit(f"--only: no study page {name!r} (one of: {', '.join(p.stem for p in pages())})")
    return candidates[0]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", default=[], help="a page (path, file name or stem); repeatable")
    parser.add_argument("--list", action="store_true", help="list the blocks and their commands; run nothing")
    parser.add_argument("--jobs", type=int, default=1, help="commands of a page run at once")
    parser.add_argument("--match", default="", help="only the blocks whose command contains this text")
    parser.add_argument("--timeout", type=float, default=None, help="seconds a command may run")
    args = parser.parse_args()
    chosen = [_page(name) for name in args.only] or pages()
    for path in chosen:
        if args.list:
            for block in blocks(path):
                print(f"{block.where}{' (checked)' if block.checked else ''}: {block.command}")
            continue
        written = write(path, args.jobs, args.timeout, args.match)
        if written:
            print(f"wrote {written} block(s) of {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
