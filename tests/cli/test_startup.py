"""cli/startup.py: the cyclic collector is paused while the command line and a command import, and left as it was
after."""

from __future__ import annotations

import gc
import json
import subprocess
import sys

import pytest

from minipaged_cli.cli.startup import collector_paused
from tests.conftest import ROOT

# In a fresh process: note whether the collector is on as each module is imported while the command line and
# simulate's module import, then whether it is on again.
_IMPORT_THEN_LIST = """
import gc, json, sys
imports = []
class Watch:
    def find_spec(self, name, path=None, target=None):
        imports.append((name, gc.isenabled()))
        return None
sys.meta_path.insert(0, Watch())
from minipaged_cli.cli.main import _command
_command("simulate")
print(json.dumps({"paused": [n for n, on in imports if not on], "on": [n for n, on in imports if on],
                  "enabled": gc.isenabled()}))
"""


def test_the_command_line_and_a_command_import_with_the_collector_paused() -> None:
    done = subprocess.run([sys.executable, "-c", _IMPORT_THEN_LIST], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    imports = json.loads(done.stdout)
    # what imports before the pause begins: the packages above cli/startup.py, and it
    assert set(imports["on"]) <= {"minipaged_cli", "minipaged_cli.cli", "minipaged_cli.cli.startup", "__future__"}
    assert {"typer", "rich.console", "numpy", "minipaged_cli.cli.main", "minipaged_cli.cli.simulate",
            "minipaged_cli.sim.replay"} <= set(imports["paused"])
    assert imports["enabled"]


@pytest.mark.parametrize("enabled", [True, False])
def test_the_collector_is_left_as_it_was(enabled: bool) -> None:
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        with collector_paused():
            assert not gc.isenabled()
        assert gc.isenabled() is enabled
        with pytest.raises(ValueError), collector_paused():
            raise ValueError("a failed import")
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()
