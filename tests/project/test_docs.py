"""Documentation that cannot rot: the site builds with --strict, the generated reference matches the code, every
runnable example prints what its page shows, and no page carries history (commit ids, machine stories, goal
verdicts)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from tests.conftest import ROOT


def _script(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # (dataclasses look their module up)
    spec.loader.exec_module(module)
    return module


reference_pages = _script("reference_pages")
runnable_examples = _script("runnable_examples")

EXAMPLES = [example for page in runnable_examples.pages() for example in runnable_examples.examples(page)]
# Examples that need the [torch] extra (the data plane).
TORCH_COMMANDS = ("run", "verify")  # (calibrate --from-vidur runs on the core install)


def test_the_site_builds_with_strict(tmp_path: Path) -> None:
    if importlib.util.find_spec("mkdocs") is None or importlib.util.find_spec("material") is None:
        pytest.skip("mkdocs-material is not installed (pip install -e \".[docs]\")")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.parametrize("path", list(reference_pages.pages()), ids=lambda p: p.name)
def test_the_generated_reference_matches_the_code(path: Path) -> None:
    assert path.read_text() == reference_pages.pages()[path], \
        f"{path.relative_to(ROOT)} is out of date: python scripts/reference_pages.py"


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.where)
def test_a_runnable_example_prints_what_its_page_shows(example) -> None:
    if example.args[0] in TORCH_COMMANDS and importlib.util.find_spec("torch") is None:
        pytest.skip("needs the [torch] extra")
    assert runnable_examples.mismatches(example, runnable_examples.run(example)) == []


def test_the_runnable_examples_cover_every_page_that_claims_output() -> None:
    # the guide's worked examples are all checked, one page each at least
    guide = {example.path.name for example in EXAMPLES if example.path.parent.name == "guide"}
    assert {"simulate.md", "sweep.md", "run.md", "verify.md", "profile.md", "calibrate.md", "convert.md"} <= guide


def test_a_mismatch_is_reported_with_its_line() -> None:
    example = next(e for e in EXAMPLES if e.path.name == "simulate.md")
    row = next(i for i, line in enumerate(example.shown) if line.lstrip().startswith("paged"))
    shown = list(example.shown)  # the paged row's first figure one higher
    shown[row] = re.sub(r"\d+\.\d", lambda m: f"{float(m.group()) + 1:.1f}", shown[row], count=1)
    assert shown[row] != example.shown[row]
    wrong = runnable_examples.Example(example.path, example.start, example.end, example.command, shown,
                                      args=example.args)
    printed = "\n".join(example.shown)
    assert runnable_examples.mismatches(example, printed) == []
    assert "the page shows" in runnable_examples.mismatches(wrong, printed)[0]


HISTORY = [
    (re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b"), "a commit id"),
    (re.compile(r"\bgoals?\b", re.I), "a goal verdict"),
    (re.compile(r"\b(2|two)[- ]cores?\b|\bshared (machine|cores)\b|\bin turns\b|\bthis (machine|CPU)\b"
                r"|\bload average\b|\bquiet(er)? machine\b|\bother jobs\b", re.I), "a machine story"),
    (re.compile(r"\bissue \d+|\bthis branch\b|\bon main\b", re.I), "history"),
]
# Hex words that are not commit ids.
NOT_COMMITS = re.compile(r"e4m3|e5m2")


def test_no_page_carries_history() -> None:
    found = []
    for path in runnable_examples.pages():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            for pattern, what in HISTORY:
                for match in pattern.finditer(line):
                    if what == "a commit id" and NOT_COMMITS.search(match.group()):
                        continue
                    found.append(f"{path.relative_to(ROOT)}:{number}: {what}: {match.group()!r}")
    assert found == []


def test_the_readme_is_short_and_keeps_the_quick_start() -> None:
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    assert "pip install -e . && minipaged simulate traces/mixed.yaml" in readme
    assert 'pip install -e ".[test]" && pytest -q' in readme


def test_every_picture_a_page_shows_exists() -> None:
    missing = []
    for path in runnable_examples.pages():
        for target in re.findall(r"!\[[^]]*\]\(([^)]+)\)", path.read_text()):
            if not (path.parent / target).resolve().is_file():
                missing.append(f"{path.relative_to(ROOT)}: {target}")
    assert missing == []


def test_the_benchmark_pages_are_written_by_their_script() -> None:
    # markdown_page.py wraps a script's output; a script with a --markdown of its own names its command
    for page in (ROOT / "docs" / "benchmarks").glob("*.md"):
        if page.name != "index.md":
            text = page.read_text()
            assert "Written by `python benchmarks/markdown_page.py`" in text or re.search(
                r"Written by\n\n    python benchmarks/\w+\.py ", text), page.name


def test_the_json_page_names_every_key_simulate_writes() -> None:
    from typer.testing import CliRunner

    from minipaged_cli.cli.main import app

    result = CliRunner().invoke(app, ["simulate", str(ROOT / "traces" / "burst.yaml"), "--strategies", "paged",
                                      "--json", "-"])
    assert result.exit_code == 0, result.stderr
    data = json.loads(result.stdout)
    page = (ROOT / "docs" / "reference" / "json.md").read_text()
    simulate = page.split("## simulate", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([a-z_0-9]+)`", simulate))
    memory = page.split("## simulate", 1)[0]  # the memory categories' keys, before
    named |= set(re.findall(r"`([a-z_0-9]+)`", memory))
    for section in ("config", "trace"):
        listed = re.search(rf"`{section}` \{{(.*?)\}}", simulate, re.S)
        assert listed is not None, section
        assert set(re.findall(r"`([a-z_0-9]+)`", listed.group(1))) == set(data[section]), section
    assert set(data["strategies"]["paged"]) - named == set()


def test_every_script_a_page_names_exists() -> None:
    missing = []
    for path in runnable_examples.pages():
        text = path.read_text()
        for match in re.finditer(r"\b((?:scripts|benchmarks|parity|tests)/[\w/]+\.(?:py|sh))\b", text):
            if "vLLM's" not in text[max(0, match.start() - 10):match.start()] and not (ROOT / match[1]).is_file():
                missing.append(f"{path.relative_to(ROOT)}: {match[1]}")  # (vLLM's own files are vLLM's)
    assert missing == []


study_pages = _script("study_pages")
STUDY_BLOCKS = [block for page in study_pages.pages() for block in study_pages.blocks(page)]
FENCE = re.compile(r"^```(?P<lang>[\w-]*)\n(?P<body>.*?)^```\n", re.M | re.S)


def test_every_output_block_of_a_study_page_is_written_by_its_script() -> None:
    # a block that shows what a command printed (```console, or a fence without a language) follows the study
    # marker (or the runnable one), so scripts/study_pages.py rewrites it from its command
    unmarked = []
    for path in study_pages.pages():
        text = path.read_text()
        for match in FENCE.finditer(text):
            if match["lang"] not in ("", "console", "text"):
                continue
            before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            if not before.startswith(("<!-- study: written by scripts/study_pages.py", "<!-- runnable")):
                line = text[:match.start()].count("\n") + 1
                unmarked.append(f"{path.relative_to(ROOT)}:{line}")
    assert unmarked == []
    assert {block.path.name for block in STUDY_BLOCKS} >= {"paging-vs-contiguous.md", "vllm-paper.md"}


def _click_command(args: list[str]):
    import typer

    from minipaged_cli.cli.main import app

    group = typer.main.get_command(app)
    command = group.commands.get(args[0]) if hasattr(group, "commands") else None
    assert command is not None, f"no command {args[0]!r}"
    return command


@pytest.mark.parametrize("block", STUDY_BLOCKS, ids=lambda b: b.where)
def test_a_study_block_names_a_command_that_exists(block) -> None:
    args = block.args
    assert block.shown, f"{block.where}: no output (python scripts/study_pages.py --only {block.path.name})"
    if block.command.startswith("python "):
        module = args[1] if args[0] == "-m" else None
        target = ROOT / (module.replace(".", "/") + ".py") if module else ROOT / args[0]
        assert target.is_file(), f"{block.where}: {target} does not exist"
        return
    command = _click_command(args)
    known = {name for param in command.params for name in (*param.opts, *param.secondary_opts)}
    unknown = [arg.split("=", 1)[0] for arg in args[1:] if arg.startswith("-") and arg.split("=", 1)[0] not in known
               and not re.fullmatch(r"-\d[\d.]*", arg)]
    assert unknown == [], f"{block.where}: {args[0]} has no option {unknown}"
    for arg in args[1:]:  # files of this repository the command reads (the public traces may be absent)
        if re.fullmatch(r"(traces|configs)/[\w./-]+", arg):
            assert (ROOT / arg).is_file(), f"{block.where}: {arg} does not exist"


@pytest.mark.parametrize("block", [b for b in STUDY_BLOCKS if b.checked], ids=lambda b: b.where)
def test_a_fast_study_block_prints_what_its_page_shows(block) -> None:
    if block.args[0] in TORCH_COMMANDS and importlib.util.find_spec("torch") is None:
        pytest.skip("needs the [torch] extra")
    if "../shared/traces" in block.command and not (ROOT.parent / "shared" / "traces").is_dir():
        pytest.skip("needs the public traces in ../shared/traces")
    example = runnable_examples.Example(block.path, block.start, block.end, block.command, block.shown,
                                        block.ignore, 0.0, block.args)
    assert runnable_examples.mismatches(example, study_pages.run(block)) == []


# Study pages that still hold a table of figures that scripts/study_pages.py does not write, and why: those copied
# by hand from earlier runs leave this list when their figures move into study blocks; a page written by a benchmark
# script says so ("Written by `python benchmarks/...`").
HAND_TABLES = {
    "todays-models.md": "the models' sizes, checked by tests/workloads/test_presets_today.py",
}


def test_no_study_page_holds_a_table_of_figures_no_script_wrote() -> None:
    holding = set()
    for path in sorted((ROOT / "docs" / "studies").glob("*.md")):
        if path.name == "index.md":  # (the studies' list)
            continue
        text = FENCE.sub("", path.read_text())
        if "Written by `python benchmarks/" in text:
            continue
        if any(line.startswith("|") and re.search(r"\d", line) and not re.fullmatch(r"[|\s:-]+", line)
               for line in text.splitlines()):
            holding.add(path.name)
    assert holding == set(HAND_TABLES)
