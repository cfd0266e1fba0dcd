"""What ``minipaged simulate`` imports: its own command module and what it runs, none of the other commands'.

The group builds a command when it is asked for (``cli/main.py``), and a command imports inside itself what only
some of its options use. Measured on a one-request trace: of ``cli/``, simulate's module and the shared ones
(``common``, ``render``, the option modules it reads); of the fleet, ``fleet.names`` alone (the router names and
defaults of simulate's fleet options: the fleet's configuration is imported when a fleet is asked for); nothing of
``apps/`` or the data plane; of the trace readers, none but the YAML one. ``--help`` and ``--version`` build no
command, and import neither NumPy nor pydantic.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

# Run a command line as the console script does, then list every module the process holds (after what it printed).
_RUN_THEN_LIST = """
import json, sys
from minipaged_cli.cli.main import main
sys.argv = ["minipaged", *sys.argv[1:]]
try:
    main()
except SystemExit as done:
    assert done.code in (0, None), done.code
print(json.dumps(sorted(sys.modules)))
"""

# Third-party packages that only other commands or options use; pydantic, which Typer 0.29 converts option values
# with, converts only values that are not plain (cli/option_values.py).
NOT_IMPORTED = ("torch", "ray", "matplotlib", "transformers", "safetensors", "huggingface_hub", "concurrent.futures",
                "pydantic")

# Of the simulator, what only some options use: a calibration (--calibration), the layout (--plot-layout), the
# sessions' report (a trace of sessions, --clients); and Rich's progress bar (a long replay on a terminal).
OPTION_MODULES = ("minipaged_cli.sim.calibration", "minipaged_cli.sim.layout", "minipaged_cli.sim.session_report",
                  "rich.progress")

OTHER_COMMANDS = ("sweep", "run", "verify", "profile", "calibrate", "convert")
# The readers of the formats a YAML trace is not.
OTHER_READERS = ("minipaged_cli.workloads.aiperf", "minipaged_cli.workloads.sharegpt",
                 "minipaged_cli.workloads.bench_configs")

# Inside the packages that other commands or options use, the modules simulate may load.
ALLOWED_INSIDE = {
    "minipaged_cli.apps": set(),
    "minipaged_cli.dataplane": set(),
    "minipaged_cli.fleet": {"minipaged_cli.fleet", "minipaged_cli.fleet.names"},
    "minipaged_cli.cli.": {f"minipaged_cli.cli.{name}" for name in (
        "common", "flags", "fleet_options", "grammar", "main", "option_values", "outputs", "render", "settings",
        "simulate", "startup", "tier_options", "workload_options")},
}


def _modules_after(*args: str) -> set[str]:
    done = subprocess.run([sys.executable, "-c", _RUN_THEN_LIST, *args], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return set(json.loads(done.stdout.splitlines()[-1]))


def _simulate_modules(tmp_path: Path) -> set[str]:
    trace = tmp_path / "one.yaml"
    trace.write_text("version: 1\nname: one\nrequests:\n"
                     "  - {id: r0, arrival_s: 0.0, prompt_tokens: 100, output_tokens: 10}\n")
    report = tmp_path / "one.json"
    modules = _modules_after("simulate", str(trace), "--json", str(report))
    assert json.loads(report.read_text())["strategies"]["paged"]["completed_requests"] == 1  # it did simulate
    return modules


def test_simulate_imports_no_other_commands_engines(tmp_path: Path) -> None:
    modules = _simulate_modules(tmp_path)
    assert "minipaged_cli.sim.replay" in modules  # the list is the simulating process's
    assert sorted(name for name in NOT_IMPORTED if name in modules) == []
    assert sorted(name for name in OPTION_MODULES if name in modules) == []
    assert sorted(name for name in OTHER_COMMANDS if f"minipaged_cli.cli.{name}" in modules) == []
    assert sorted(name for name in OTHER_READERS if name in modules) == []
    for package, allowed in ALLOWED_INSIDE.items():
        extra = sorted(name for name in modules if name.startswith(package) and name not in allowed)
        assert extra == [], f"simulate's start-up imports {extra}: import them where their command uses them"


@pytest.mark.parametrize("args", [("--help",), ("--version",)])
def test_help_and_version_build_no_command(args: tuple[str, ...]) -> None:
    """The group's help lists the commands by their help lines without importing their modules (nor NumPy, which
    every simulating or data-plane command needs)."""
    modules = _modules_after(*args)
    assert "minipaged_cli.cli.main" in modules  # the list is the process's that ran the command line
    commands = sorted(name for name in ("simulate", *OTHER_COMMANDS) if f"minipaged_cli.cli.{name}" in modules)
    assert commands == []
    assert sorted(name for name in ("numpy", "pydantic", *NOT_IMPORTED) if name in modules) == []


def test_simulates_annotations_are_objects_not_text() -> None:
    """Typer reads a command's signature several times a run (to build its options, to call it): simulate's
    annotations are the option objects themselves, so that no reading evaluates its fifty-odd annotations again."""
    from minipaged_cli.cli.simulate import simulate_command

    annotations = inspect.get_annotations(inspect.unwrap(simulate_command))
    assert len(annotations) > 50  # every option's (53), and the return's
    assert [name for name, annotation in annotations.items() if isinstance(annotation, str)] == []
