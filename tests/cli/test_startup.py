"""cli/startup.py: the cyclic collector is paused while the command line and a command import, and left as it was
after; the command line's own process freezes what the imports allocated, a program that imports it does not. A
replay command's own process runs NumPy's OpenBLAS on one thread, unless the user chose a number; a program that
imports the command line, and a command that runs torch, keep OpenBLAS's default (a thread per core). simulate
replays with the collector paused (one engine or a fleet), and a replay of one engine makes no reference cycle."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from minipaged_cli.cli.main import app
from minipaged_cli.cli.startup import collector_paused, lasting
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import Replay, replay
from minipaged_cli.workloads.presets import GpuSpec, ModelSpec
from minipaged_cli.workloads.trace import Request, make_trace
from tests.conftest import ROOT

# In a fresh process: note whether the collector is on as each module is imported, run what the argument says, then
# print each import in order with whether the collector was on, those it was off for, whether it is on again, and
# how many objects are frozen.
_WATCH_THEN_RUN = """
import gc, json, runpy, sys
imports = []
class Watch:
    def find_spec(self, name, path=None, target=None):
        imports.append((name, gc.isenabled()))
        return None
sys.meta_path.insert(0, Watch())
how, trace = sys.argv[1:]
try:
    if how == "library":  # a program that imports the command line and builds a command
        from minipaged_cli.cli.main import _command
        _command("simulate")
    elif how == "-m":  # python -m minipaged_cli simulate TRACE
        sys.argv = ["minipaged_cli", "simulate", trace]
        runpy.run_module("minipaged_cli", run_name="__main__", alter_sys=True)
    else:  # the console script: its file is named minipaged
        sys.argv = ["/venv/bin/minipaged", "simulate", trace]
        from minipaged_cli.cli.main import main
        main()
except SystemExit as done:
    assert done.code in (0, None), done.code
print(json.dumps({"order": imports, "paused": [n for n, on in imports if not on],
                  "enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}))
"""

# Our modules that import before the pause begins: the packages above cli/startup.py, and it. (With them, the
# standard library modules startup.py imports that the interpreter had not: which ones depends on the environment,
# such as an editable install's import hook.)
BEFORE_THE_PAUSE = {"minipaged_cli", "minipaged_cli.cli", "minipaged_cli.cli.startup"}


def _run(how: str, tmp_path: Path) -> dict:
    trace = tmp_path / "one.yaml"
    trace.write_text("version: 1\nname: one\nrequests:\n"
                     "  - {id: r0, arrival_s: 0.0, prompt_tokens: 100, output_tokens: 10}\n")
    done = subprocess.run([sys.executable, "-c", _WATCH_THEN_RUN, how, str(trace)], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])


def test_the_command_line_and_a_command_import_with_the_collector_paused(tmp_path: Path) -> None:
    run = _run("library", tmp_path)  # (a command that runs imports more, as it runs, with the collector on)
    order = run["order"]
    pause = next(i for i, (_, on) in enumerate(order) if not on)
    assert not [name for name, on in order[pause:] if on]  # once paused, every import is
    before = {name for name, _ in order[:pause]}
    assert {name for name in before if name.split(".")[0] == "minipaged_cli"} <= BEFORE_THE_PAUSE
    assert all(name.split(".")[0] in {"minipaged_cli", *sys.stdlib_module_names} for name in before), before
    assert {"typer", "rich.console", "numpy", "minipaged_cli.cli.main", "minipaged_cli.cli.simulate",
            "minipaged_cli.sim.replay"} <= set(run["paused"])
    assert run["enabled"]


@pytest.mark.parametrize("how", ["library", "-m", "console script"])
def test_only_the_command_lines_own_process_freezes_its_imports(how: str, tmp_path: Path) -> None:
    run = _run(how, tmp_path)
    assert run["frozen"] == 0 if how == "library" else run["frozen"] > 10_000
    assert run["enabled"]


@pytest.mark.parametrize("pause", [lasting, collector_paused])
@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_left_as_it_was(pause: Callable, enabled: bool) -> None:
    was, frozen = gc.isenabled(), gc.get_freeze_count()
    try:
        (gc.enable if enabled else gc.disable)()
        with pause():
            assert not gc.isenabled()
        assert gc.isenabled() is enabled
        with pytest.raises(ValueError), pause():
            raise ValueError("a failed import")
        assert gc.isenabled() is enabled
        assert gc.get_freeze_count() == frozen  # pytest imports it: nothing frozen
    finally:
        (gc.enable if was else gc.disable)()


# In a fresh process, with the environment given: build or run a command, then print how many threads the process
# has (OpenBLAS starts its own when NumPy loads, and keeps them) and what OPENBLAS_NUM_THREADS says.
_THREADS_AFTER = """
import json, os, runpy, sys
how, trace = sys.argv[1:]
if how == "library":  # a program that imports the command line, builds a command and uses NumPy
    from minipaged_cli.cli.main import _command
    _command("simulate")
    import numpy
else:  # python -m minipaged_cli COMMAND ...
    sys.argv = ["minipaged_cli", *how.split(), trace]
    try:
        runpy.run_module("minipaged_cli", run_name="__main__", alter_sys=True)
    except SystemExit as done:
        assert done.code in (0, None), done.code
print(json.dumps([len(os.listdir("/proc/self/task")), os.environ.get("OPENBLAS_NUM_THREADS")]))
"""


def _openblas_threads(how: str, tmp_path: Path, **chosen: str) -> tuple[int, str | None]:
    """(threads, OPENBLAS_NUM_THREADS) of a process that ran ``how``, under an environment with no number of threads
    but those ``chosen``."""
    numpy = pytest.importorskip("numpy")
    if not Path("/proc/self/task").is_dir():
        pytest.skip("counts threads in /proc (Linux)")
    if "openblas" not in numpy.show_config(mode="dicts")["Build Dependencies"]["blas"]["name"]:
        pytest.skip("NumPy's BLAS is not OpenBLAS")
    trace = tmp_path / "one.yaml"
    trace.write_text("version: 1\nname: one\nrequests:\n"
                     "  - {id: r0, arrival_s: 0.0, prompt_tokens: 100, output_tokens: 10}\n")
    env = {key: value for key, value in os.environ.items()
           if key not in {"OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS", "OMP_NUM_THREADS"}}
    done = subprocess.run([sys.executable, "-c", _THREADS_AFTER, how, str(trace)], capture_output=True, text=True,
                          cwd=ROOT, env={**env, **chosen})
    assert done.returncode == 0, done.stderr
    threads, variable = json.loads(done.stdout.splitlines()[-1])
    return threads, variable


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@pytest.mark.parametrize("command", ["simulate", "convert --help"])
def test_a_replay_commands_process_runs_openblas_on_one_thread(command: str, tmp_path: Path) -> None:
    threads, variable = _openblas_threads(command, tmp_path)
    assert variable == "1"
    if command == "simulate":  # (it imported NumPy: no thread but the main one)
        assert threads == 1


def test_a_program_that_imports_the_command_line_keeps_openblas_default(tmp_path: Path) -> None:
    threads, variable = _openblas_threads("library", tmp_path)
    assert variable is None
    if _cores() > 1:
        assert threads > 1  # (a thread per core: what the replay commands' processes are spared)


def test_a_command_that_runs_torch_keeps_openblas_default(tmp_path: Path) -> None:
    assert _openblas_threads("run --help", tmp_path)[1] is None


@pytest.mark.parametrize("variable", ["OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS"])
def test_a_users_number_of_blas_threads_is_kept(variable: str, tmp_path: Path) -> None:
    if _cores() < 2:
        pytest.skip("two threads need two cores")
    threads, _ = _openblas_threads("simulate", tmp_path, **{variable: "2"})
    assert threads == 2


# In a fresh process: run simulate on the trace (as the command line, or as a program calling ``main``), noting each
# collection that starts while the trace loads, and, as the replay starts, how many of the trace's requests a
# collection would still traverse (the frozen are not listed by ``gc.get_objects``)
_WATCH_THE_TRACE = """
import gc, json, runpy, sys
import minipaged_cli.sim.replay as replay
from minipaged_cli.workloads.request import Request
during_load = []
def note(phase, info):
    frame = sys._getframe(1)
    while frame is not None and phase == "start":
        if frame.f_code.co_name == "load_trace":
            during_load.append(info["generation"])
        frame = frame.f_back
gc.callbacks.append(note)
seen = {}
simulate = replay.simulate
def watched(trace, *args, **kwargs):
    seen["requests"] = trace.num_requests
    seen["traversed"] = sum(type(o) is Request for o in gc.get_objects())
    return simulate(trace, *args, **kwargs)
replay.simulate = watched
how, trace = sys.argv[1:]
sys.argv = ["minipaged_cli", "simulate", trace, "--json", "-"]
try:
    if how == "-m":
        runpy.run_module("minipaged_cli", run_name="__main__", alter_sys=True)
    else:
        from minipaged_cli.cli.main import main
        main()
except SystemExit as done:
    assert done.code in (0, None), done.code
print(json.dumps({"during_load": during_load, **seen}))
"""


@pytest.mark.parametrize("how", ["library", "-m"])
def test_a_trace_loads_with_the_collector_paused_and_the_command_line_freezes_it(how: str, tmp_path: Path) -> None:
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"timestamp": i, "input_length": 40, "output_length": 2, "hash_ids": [i]})
                             + "\n" for i in range(3000)))
    done = subprocess.run([sys.executable, "-c", _WATCH_THE_TRACE, how, str(trace)], capture_output=True, text=True,
                          cwd=ROOT)
    assert done.returncode == 0, done.stderr
    run = json.loads(done.stdout.splitlines()[-1])
    assert run["during_load"] == [] and run["requests"] == 3000
    # (3,000 requests made dozens of collections as they loaded; the command line's process freezes them after)
    assert run["traversed"] == (0 if how == "-m" else 3000)



@pytest.mark.parametrize("fleet", [[], ["--replicas", "2", "--router", "round-robin"]])
def test_simulate_replays_with_the_collector_paused(fleet: list[str], monkeypatch: pytest.MonkeyPatch,
                                                    tmp_path: Path) -> None:
    trace = tmp_path / "t.yaml"
    trace.write_text("version: 1\nname: t\nrequests:\n" + "".join(
        f"  - {{id: r{i}, arrival_s: {i / 10}, prompt_tokens: 300, output_tokens: 20}}\n" for i in range(6)))
    iterate, enabled = Replay.iterate, []

    def watched(self: Replay) -> None:
        enabled.append(gc.isenabled())
        iterate(self)

    monkeypatch.setattr(Replay, "iterate", watched)
    was = gc.isenabled()
    done = CliRunner().invoke(app, ["simulate", str(trace), "--json", str(tmp_path / "out.json"), *fleet])
    assert done.exit_code == 0, done.output
    assert enabled and not any(enabled)  # every pass of the replay loop, on each replica
    assert gc.isenabled() is was


def test_a_replay_of_one_engine_makes_no_reference_cycle(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    # What ``collector_paused`` rests on: prefix caching, shared segments, preemptions, bulk and single steps,
    # every request done; a collection after the replay finds nothing to free.
    requests = [Request(f"r{i}", i * 0.01, 37 + 3 * i, 9 + 5 * (i % 4), ("sys",) if i % 2 else ()) for i in range(24)]
    trace = make_trace("t", requests, source="test", segments={"sys": 16})
    config = SimConfig.of(tiny_model, clock_gpu, num_blocks=40, block_size=4, max_model_len=256, prefix_caching=True)
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        result = replay(trace, config, "paged")
        found = gc.collect()
    finally:
        if was:
            gc.enable()
    assert result.completed_requests == 24 and result.num_preemptions > 0 and result.prefix_cache_hits > 0
    assert found == 0
