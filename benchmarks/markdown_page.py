"""Write a benchmark's output as a page of the documentation: a title, the command that wrote it, the version of
minipaged it ran, and what it printed. The benchmark pages under ``docs/benchmarks/`` are written this way, never by
hand:

    python benchmarks/markdown_page.py docs/benchmarks/step-time.md "Step times against measured GEMMs" -- \\
        python benchmarks/step_time_validation.py

The command runs from the repository's root; its stdout is the page's body, and a failing command writes nothing."""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def page(title: str, command: list[str], output: str) -> str:
    from minipaged_cli import __version__

    return (f"# {title}\n\nWritten by `python benchmarks/markdown_page.py` from this command, with minipaged "
            f"{__version__}; timings are the machine's that ran it.\n\n```bash\n{shlex.join(command)}\n```\n\n"
            f"```text\n{output.rstrip()}\n```\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path", type=Path, help="the page to write")
    parser.add_argument("title", help="the page's title")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the benchmark's command line")
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the benchmark's command after --")
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    if done.returncode != 0:
        sys.stderr.write(done.stderr)
        print(f"error: {shlex.join(command)} exited {done.returncode}; {args.path} not written", file=sys.stderr)
        return done.returncode
    args.path.write_text(page(args.title, command, done.stdout))
    print(f"wrote {args.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
