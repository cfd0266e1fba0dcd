"""benchmarks/plane_samples.py: stacks sorted into planes by its rules (worked here by hand), py-spy's raw output
counted, and a real py-spy run of a program that spins in a ``sim/`` module and in the ``memory/`` module it calls.
How the samples divide between the two is the machine's timing, which a test does not read (``test_ci``): a
benchmark's page shows the shares."""

from __future__ import annotations

import shutil
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    from plane_samples import LOAD, MEMORY, PLANES, SCHEDULING, START_UP, count_planes, plane_of, sample_planes
finally:
    sys.path.remove(str(ROOT / "benchmarks"))

MAIN = "_run_code (<frozen runpy>:88);<module> (minipaged_cli/__main__.py:3);main (minipaged_cli/cli/main.py:216)"


@pytest.mark.parametrize(("stack", "plane"), [
    # an import is start-up, whatever module it runs
    (f"{MAIN};_find_and_load (<frozen importlib._bootstrap>:1176);<module> (minipaged_cli/memory/block_pool.py:1)",
     START_UP),
    # the memory plane's work called by the scheduler is the memory plane's
    (f"{MAIN};iterate (minipaged_cli/sim/replay.py:110);schedule (minipaged_cli/sim/scheduler.py:230);"
     "admit (minipaged_cli/memory/paged.py:120)", MEMORY),
    # a request's field read by the replay is the replay's
    (f"{MAIN};iterate (minipaged_cli/sim/replay.py:99);total_tokens (minipaged_cli/workloads/request.py:40)",
     SCHEDULING),
    (f"{MAIN};route (minipaged_cli/fleet/router.py:50)", SCHEDULING),
    (f"{MAIN};load_trace (minipaged_cli/workloads/readers.py:40);make_trace.<locals>.<lambda> "
     "(minipaged_cli/workloads/trace.py:173)", LOAD),
    (f"{MAIN};read_json_lines (minipaged_cli/input_files.py:116)", LOAD),
    # an installed package's absolute paths
    ("advance (/venv/lib/python3.11/site-packages/minipaged_cli/memory/paged.py:200)", MEMORY),
    # the command line, the tables, the interpreter: start-up and output
    (f"{MAIN};render (rich/console.py:1294)", START_UP),
    ("", START_UP),
])
def test_a_stack_goes_to_the_first_plane_with_a_frame_on_it(stack: str, plane: str) -> None:
    assert plane_of(stack.split(";") if stack else []) == plane


def test_raw_output_is_counted_per_plane() -> None:
    raw = "\n".join([
        f"{MAIN};grow (minipaged_cli/memory/block_manager.py:60) 7",
        f"{MAIN};schedule (minipaged_cli/sim/scheduler.py:230) 5",
        f"{MAIN};schedule (minipaged_cli/sim/scheduler.py:231) 1",
        f"{MAIN};read_mooncake (minipaged_cli/workloads/readers.py:130) 3",
        " 4",  # samples before the interpreter ran any frame
        "__package__ (__doc__:303038721) 2",  # a torn sample (--nonblocking reads a moving stack)
        "a line cut short without its count",
    ])
    assert count_planes(raw) == {START_UP: 6, LOAD: 3, SCHEDULING: 6, MEMORY: 7}
    assert list(count_planes(raw)) == list(PLANES)


def test_py_spy_samples_go_to_the_planes_their_frames_name(tmp_path: Path) -> None:
    """``sim/loop.py`` runs a loop 4.5 million times itself, then calls ``memory/work.py``, which runs it 9 million
    times (about 0.8 s in all here; each part is many sampling intervals long on any machine): samples inside the
    memory loop, with the ``sim/`` frame beneath them, are the memory plane's; those in the ``sim/`` loop alone are
    scheduling's; none is the trace's."""
    if shutil.which("py-spy") is None:
        pytest.skip("py-spy is not installed (pip install -e '.[bench]')")
    package = tmp_path / "minipaged_cli"
    for folder in (package, package / "memory", package / "sim"):
        folder.mkdir()
        (folder / "__init__.py").write_text("")
    spin = textwrap.dedent("""
        def spin(count):
            total = 0
            for i in range(count):
                total += i * i
            return total
        """)
    (package / "memory" / "work.py").write_text(spin + "\n\ndef work():\n    spin(9_000_000)\n")
    (package / "sim" / "loop.py").write_text(
        spin + "\n\nfrom minipaged_cli.memory.work import work\n\n\ndef run():\n    spin(4_500_000)\n    work()\n")
    argv = [sys.executable, "-c", "from minipaged_cli.sim.loop import run; run()"]
    sampled = sample_planes(argv, {"PYTHONPATH": str(tmp_path), "PATH": str(Path(sys.executable).parent)}, tmp_path)
    if isinstance(sampled, str):
        pytest.skip(sampled)  # (py-spy cannot trace here: no ptrace in this container)
    assert sampled[LOAD] == 0
    assert sampled[MEMORY] > 0 and sampled[SCHEDULING] > 0


def test_a_missing_py_spy_is_one_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None)
    said = sample_planes([sys.executable, "-c", "pass"], {}, tmp_path)
    assert said == "Plane split skipped: py-spy is not installed (pip install py-spy)."
