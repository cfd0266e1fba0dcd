"""pyproject.toml against minipaged_cli/extras.py: the core install holds none of the optional modules, and the
extra each message names does install its module."""

from __future__ import annotations

import re
import sys

import pytest

from minipaged_cli.extras import EXTRAS
from tests.conftest import ROOT

tomllib = pytest.importorskip("tomllib" if sys.version_info >= (3, 11) else "tomli")


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~\[;]", requirement, maxsplit=1)[0].lower()


def _installs(optional: dict[str, list[str]], extra: str) -> set[str]:
    """The distributions ``extra`` installs, with those of the minipaged[...] extras it names."""
    names: set[str] = set()
    for requirement in optional[extra]:
        inner = re.fullmatch(r"minipaged\[(.+)\]", requirement)
        if inner:
            for name in inner.group(1).split(","):
                names |= _installs(optional, name.strip())
        else:
            names.add(_name(requirement))
    return names


def test_the_core_holds_no_optional_module_and_each_extra_installs_its_modules() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert {_name(r) for r in project["dependencies"]} == {"numpy", "typer", "rich", "pyyaml"}
    optional = project["optional-dependencies"]
    for module, extra in EXTRAS.items():  # these modules are named as their distributions are
        assert module in _installs(optional, extra), (module, extra)
    assert _installs(optional, "test") >= set(EXTRAS) - {"pycuda"}  # the tests need every extra but the GPU's
