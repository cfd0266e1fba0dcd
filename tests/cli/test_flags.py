"""cli/flags.py: the one map from the library's setting names to the command line's flags."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import typer

from minipaged_cli.cli.flags import FLAGS, error_line, flag_for
from minipaged_cli.cli.main import app
from minipaged_cli.errors import SETTING_REFERENCE, InputError
from tests.conftest import ROOT

LIBRARY = ROOT / "minipaged_cli"


def _options() -> set[str]:
    """Every option spelling of every command, read from the Typer app itself."""
    found: set[str] = set()

    def walk(command: object) -> None:
        for param in getattr(command, "params", []):
            found.update(getattr(param, "opts", []), getattr(param, "secondary_opts", []))
        for sub in getattr(command, "commands", {}).values():
            walk(sub)

    walk(typer.main.get_command(app))
    return found


def _library_sources() -> list[Path]:
    return [path for path in LIBRARY.rglob("*.py") if "cli" not in path.relative_to(LIBRARY).parts]


def test_every_flag_of_the_map_is_an_option_of_some_command() -> None:
    options = _options()
    assert [flag for flag in FLAGS.values() if flag.removesuffix(" (blocks)") not in options] == []


def test_the_library_writes_no_flag() -> None:
    # A string that starts with "--" names a flag: the library names the setting instead
    pattern = re.compile(r"""["']--[a-z]""")
    hits = [f"{path.relative_to(ROOT)}:{number}" for path in _library_sources()
            for number, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert hits == []


def _literal_texts(path: Path) -> list[str]:
    """The text of every string literal in ``path`` but its docstrings (an f-string's literal parts, with
    ``{{`` already read as ``{``): where a setting reference can be written."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Expr)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_every_setting_the_library_refers_to_has_a_flag_or_none_by_design() -> None:
    # A typo ({max_num_seq}) would reach the user as written: each reference is a setting the map knows, or one
    # that no command sets (the library's name is then the best there is)
    library_only = {"cache_aware_admission_window", "cache_aware_admission_threshold"}  # (parity's, no option)
    names = {match[1] for path in _library_sources() for text in _literal_texts(path)
             for match in SETTING_REFERENCE.finditer(text)}
    assert "scheduler" in names and "max_model_len" in names  # (the scan finds them)
    assert names - set(FLAGS) - library_only == set()


@pytest.mark.parametrize(("setting", "value", "flag"), [
    ("max_num_seqs", None, "--max-num-seqs"),
    ("scheduler", "v0", "--scheduler v0"),
    ("hybrid_kv", "False", "--no-hybrid-kv"),
    ("prefix_caching", "True", "--prefix-caching"),
    ("long_prefill_token_threshold", None, "--long-prefill-threshold"),
    ("cpu_kv_blocks", None, "--cpu-kv-memory (blocks)"),
    ("pools", None, "pools"),  # no flag sets it: the library's name stays
])
def test_a_setting_as_the_command_line_names_it(setting: str, value: str | None, flag: str) -> None:
    assert flag_for(setting, value) == flag


def test_an_error_reads_as_settings_in_the_library_and_as_flags_on_the_command_line() -> None:
    error = InputError("swap is v0's ({scheduler=v0}); pass {hybrid_kv=False}", field="{preemption}", value="swap",
                       has_value=True)
    assert str(error) == "preemption: 'swap': swap is v0's (scheduler=v0); pass hybrid_kv=False"
    assert error_line(error) == "--preemption: 'swap': swap is v0's (--scheduler v0); pass --no-hybrid-kv"
    in_a_file = InputError("must be >= 1", source="sweep.yaml", field="block_size", value=0, has_value=True)
    assert error_line(in_a_file) == str(in_a_file) == "sweep.yaml: block_size: 0: must be >= 1"
    braces = InputError("unknown key", field="x", value="{a b}", has_value=True)  # a value's braces stay
    assert error_line(braces) == "x: '{a b}': unknown key"
