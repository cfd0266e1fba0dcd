"""benchmarks/peer_speed.py on a tiny trace: its page holds the figures it measured, and they are the ones an
independent ``minipaged simulate --json`` run reports; without the Dynamo packages its column is skipped with one
line."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def tiny_mooncake(path: Path) -> None:
    """Six requests 10 ms apart, 12,000-token prompts sharing their first 4,096 tokens (8 Mooncake blocks of 512)
    and 2,000 output tokens: 63,520 tokens at their longest, the shared prefix counted once, against the row's
    58,240 (3,640 blocks of 16), so some are preempted."""
    lines = [json.dumps({"timestamp": 10 * i, "input_length": 12000, "output_length": 2000,
                         "hash_ids": list(range(8)) + [100 * (i + 1) + j for j in range(16)]}) for i in range(6)]
    path.write_text("\n".join(lines) + "\n")


def test_the_page_holds_the_measured_figures_and_skips_the_missing_core(tmp_path: Path) -> None:
    trace = tmp_path / "mooncake_conversation_trace.jsonl"
    tiny_mooncake(trace)
    page = tmp_path / "peer-speed.md"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    # This interpreter has no Dynamo packages (the test environment never installs them): the column is skipped.
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peer_speed.py"), "--traces", str(tmp_path),
                           "--rows", "mooncake-3640", "--repeats", "1", "--dynamo-python", sys.executable,
                           "--planes", "--profile", "5", "--markdown", str(page)], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    skip_lines = [line for line in done.stdout.splitlines() if "Dynamo column skipped" in line]
    assert len(skip_lines) == 1 and "pip install ai-dynamo-runtime==1.6.1" in skip_lines[0]

    # The reference: the same settings written out here, one ordinary run of the CLI (the longest request the
    # pool can hold: 3,640 blocks of 16 tokens).
    result = tmp_path / "reference.json"
    reference = subprocess.run(
        [sys.executable, "-m", "minipaged_cli", "simulate", str(trace), "--strategies", "paged", "--block-size", "16",
         "--num-blocks", "3640", "--max-batched-tokens", "8192", "--max-num-seqs", "1024", "--max-model-len",
         "58240", "--prefix-caching", "--json", str(result)], env=env, capture_output=True, text=True, timeout=300)
    assert reference.returncode == 0, reference.stderr
    paged = json.loads(result.read_text())["strategies"]["paged"]
    assert paged["num_preemptions"] > 0 and paged["prefix_cache_hits"] > 0  # the figures under test are not zeros

    # (the table, then, where py-spy samples here, the plane split; else one line says why not)
    planes_skipped = [line for line in done.stdout.splitlines() if line.startswith("Plane split skipped:")]
    sampled = not planes_skipped
    assert sampled or shutil.which("py-spy") is None or "could not sample" in planes_skipped[0]
    printed = [line for line in done.stdout.splitlines() if line.startswith("Mooncake conversation, 3,640 blocks")]
    assert len(printed) == 1 + sampled
    text = page.read_text()
    assert skip_lines[0] in text and "python benchmarks/peer_speed.py --repeats 1" in text
    assert "environment of their own" not in text  # (minipaged ran in this Python: the page says nothing of it)
    assert "--planes --profile 5" in text
    above = text.split("What the two cannot share", 1)[0]  # (the plane split lists the row again)
    rows = [line for line in above.splitlines() if line.startswith("| Mooncake conversation, 3,640 blocks |")]
    assert len(rows) == 1
    cells = [cell.strip() for cell in rows[0].strip("|").split("|")]
    core_cpu, cpu, core_peak, peak, hit, preemptions, completed, ratio, spread = cells[1:]
    assert (core_cpu, core_peak, ratio, spread) == ("-", "-", "-", "-")
    assert hit == f"- / {paged['prefix_cache_hit_pct']:.2f}"
    assert preemptions == f"- / {paged['num_preemptions']}"
    assert completed == f"- / {paged['completed_requests']:,}"
    assert float(cpu) > 0 and float(peak) > 0
    assert printed[0].split() == ["Mooncake", "conversation,", "3,640", "blocks", "-", cpu, "-", peak,
                                  *hit.split(), *preemptions.split(), *completed.split(), "-", "-"]

    # The plane split: where py-spy samples here, the run's CPU seconds split into the four planes (their seconds
    # sum to the row's, their shares to 100%, each rounded), as printed; else the line that says why not.
    planes = text.split("## Where minipaged's CPU goes, by plane", 1)[1].split("## Where minipaged's time goes")[0]
    split = [line for line in planes.splitlines() if line.startswith("| Mooncake conversation, 3,640 blocks |")]
    if not sampled:
        assert not split and len(planes_skipped) == 1 and planes_skipped[0] in planes
    else:
        assert len(split) == 1
        cells = [cell.strip() for cell in split[0].strip("|").split("|")]
        assert cells[1:3] == ["-", cpu]
        seconds = [float(cell.split()[0]) for cell in cells[3:]]
        shares = [float(cell.split()[1].strip("(%)")) for cell in cells[3:]]
        assert len(seconds) == 4 and sum(seconds) == pytest.approx(float(cpu), abs=0.021)
        assert sum(shares) == pytest.approx(100, abs=2) and shares[0] > 0
        assert printed[1].split()[4:] == ["-", cpu, *" ".join(cells[3:]).split()]

    # The profile: five functions and five files, most self time first, as printed; a file's share holds at least
    # those of its functions listed, and no share list sums above the whole run.
    section = text.split("### Mooncake conversation, 3,640 blocks", 1)[1]
    table = [[cell.strip().strip("`") for cell in line.strip("|").split("|")]
             for line in section.splitlines() if line.startswith("| `")]
    assert len(table) == 5
    functions = [(name, float(pct)) for name, pct, _, _ in table]
    files = [(name, float(pct)) for _, _, name, pct in table]
    for shares in (functions, files):
        percents = [pct for _, pct in shares]
        assert percents == sorted(percents, reverse=True) and percents[-1] > 0 and sum(percents) <= 100.05
    for file, pct in files:
        assert sum(share for name, share in functions if name.startswith(f"{file}: ")) <= pct + 0.15
    printed_shares = [line.split(None, 1) for line in done.stdout.splitlines()[-11:-1]]
    assert [(name, f"{float(pct):.1f}") for pct, name in printed_shares] == \
        [(name, f"{pct:.1f}") for name, pct in [*functions, *files]]



def test_minipaged_runs_load_byte_code_compiled_before_them(tmp_path: Path) -> None:
    """The core's package comes compiled by ``pip install``; minipaged's processes get the same: the checkout's
    modules are compiled before any runs, and a process loads them from there, ``PYTHONDONTWRITEBYTECODE`` or not
    (a copy of the package stands for the checkout)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import peer_speed
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    shutil.copytree(ROOT / "minipaged_cli", tmp_path / "minipaged_cli",
                    ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    env = {**peer_speed.compiled_env(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    assert env["PYTHONPATH"] == str(tmp_path)
    compiled = {path: path.stat().st_mtime_ns for path in (tmp_path / "minipaged_cli").rglob("*.pyc")}
    assert len(compiled) == len(list((tmp_path / "minipaged_cli").rglob("*.py")))
    # (``-v`` names each module's code object as it loads it: from its .pyc, or compiled from the source)
    done = subprocess.run([sys.executable, "-v", "-c", "import minipaged_cli.sim.replay"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, check=True)
    loaded = [line for line in done.stderr.splitlines() if line.startswith("# code object from")]
    replay = tmp_path / "minipaged_cli" / "sim" / "replay.py"
    assert f"# code object from '{importlib.util.cache_from_source(str(replay))}'" in loaded
    assert not [line for line in loaded if str(tmp_path) in line and not line.endswith(".pyc'")]
    assert {path: path.stat().st_mtime_ns for path in compiled} == compiled  # (read, not written again)


def test_minipaged_runs_in_the_python_named_for_it(tmp_path: Path) -> None:
    # --minipaged-python: the byte code is compiled, and every run made, by the Python named (here a script that
    # notes its arguments and runs this interpreter); the page's command says so
    trace = tmp_path / "mooncake_conversation_trace.jsonl"
    tiny_mooncake(trace)
    calls = tmp_path / "calls.txt"
    python = tmp_path / "noting-python"
    python.write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    page = tmp_path / "peer-speed.md"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "peer_speed.py"), "--traces", str(tmp_path),
                           "--rows", "mooncake-3640", "--repeats", "2", "--dynamo-python", sys.executable,
                           "--minipaged-python", str(python), "--markdown", str(page)],
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    noted = calls.read_text().splitlines()
    assert [line.split()[:2] for line in noted] == [["-m", "compileall"], ["-m", "minipaged_cli"],
                                                   ["-m", "minipaged_cli"]]
    assert "--minipaged-python MINIPAGED_PYTHON" in page.read_text()
    assert "minipaged's dependencies alone in an environment of their own." in page.read_text()


def test_a_rows_ratio_is_the_median_of_its_pairs_beside_their_quartiles() -> None:
    # Five pairs, worked by hand: ratios 0.8, 0.9, 1.0, 1.1, 1.3 (minipaged / core, pair by pair). Their median is
    # 1.0; the quartiles, interpolated between the ordered ratios at positions 1 and 3 of 0..4: 0.9 and 1.1. The
    # CPU columns are each side's own median (1.0 and 1.0 here, by construction), not a ratio of them.
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import peer_speed
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    core_s = [1.0, 2.0, 1.0, 1.0, 0.5]
    mine_s = [0.8, 1.8, 1.0, 1.1, 0.65]
    runs = [peer_speed.Run(cpu, 60.0, 5.0, 3, 10) for cpu in mine_s]
    core = [peer_speed.Run(cpu, 200.0, 5.1, 4, 10) for cpu in core_s]
    row = peer_speed.table_row(peer_speed.Measured(peer_speed.ROWS[2], runs, core))
    assert row[1:3] == ["1.00", "1.00"]
    assert row[-2:] == ["1.00x (even)", "0.90-1.10"]
    faster = peer_speed.table_row(peer_speed.Measured(peer_speed.ROWS[2], runs[:3], core[:3]))
    assert faster[-2:] == ["0.90x (faster)", "0.85-0.95"]  # (0.8, 0.9, 1.0: the quartiles halfway between)
    slower = peer_speed.table_row(peer_speed.Measured(peer_speed.ROWS[2], runs[:1], [peer_speed.Run(0.5, 1, 0, 0, 1)]))
    assert slower[-2:] == ["1.60x (slower)", "1.60-1.60"]  # (one pair: no spread to show)
