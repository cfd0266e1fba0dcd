"""One grammar for every command: every old spelling and every alias listed (and working), every option under a help
panel, settings files (--config, --print-config) on every command, --version, and simulate without a trace."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import typer
import yaml
from typer.testing import CliRunner

from minipaged_cli import __version__
from minipaged_cli.cli.grammar import PANELS, RENAMED
from minipaged_cli.cli.main import app
from tests.conftest import ROOT

MIXED = str(ROOT / "traces" / "mixed.yaml")
BURST = str(ROOT / "traces" / "burst.yaml")
runner = CliRunner()

# Every option with a second name: the plural list and its singular alias.
ALIASES = {
    ("profile", "--block-sizes"): "--block-size",
    ("sweep", "--block-sizes"): "--block-size",
    ("sweep", "--models"): "--model",
    ("sweep", "--gpus"): "--gpu",
}
# One command line per old spelling, and what it gives under the new one.
OLD_SPELLINGS = {
    ("*", "--format"): (["convert", BURST, "OUT", "--limit", "2", "--format", "yaml"], "wrote"),
    ("run", "--layers"): (["run", MIXED, "--device", "cpu", "--layers", "99"], "--num-layers: 99: must be in [1, 36]"),
    ("verify", "--config"): (["verify", "--config", "nope"], "--model-config: 'nope': no such config"),
}
NEEDS_TORCH = {"run", "verify"}


def _commands() -> dict[str, object]:
    group = typer.main.get_command(app)
    ctx = group.context_class(group, info_name="minipaged")
    return {name: group.get_command(ctx, name) for name in group.list_commands(ctx)}


def test_every_old_spelling_is_listed_and_tested() -> None:
    assert set(OLD_SPELLINGS) == set(RENAMED)


@pytest.mark.parametrize("old", sorted(OLD_SPELLINGS), ids=lambda old: f"{old[0]} {old[1]}")
def test_an_old_spelling_works_for_one_release_with_a_note(old: tuple[str, str], tmp_path: Path) -> None:
    args, expected = OLD_SPELLINGS[old]
    if args[0] in NEEDS_TORCH and importlib.util.find_spec("torch") is None:
        pytest.skip("needs the [torch] extra")
    args = [str(tmp_path / "out.yaml") if arg == "OUT" else arg for arg in args]
    result = runner.invoke(app, args)
    new = RENAMED[old]
    assert f"note: {old[1]} is deprecated; use {new} (the old spelling goes in the next release)" in result.stderr
    assert expected in result.stdout + result.stderr


def test_a_settings_file_named_by_verify_config_is_not_a_model_config(tmp_path: Path) -> None:
    from minipaged_cli.cli.grammar import renamed

    settings = tmp_path / "verify.yaml"
    settings.write_text("layer: 1\n")
    model = tmp_path / "qwen3.yaml"
    model.write_text("model_type: qwen3\nhidden_size: 64\n")
    assert renamed(["verify", "--config", str(settings)]) == ["verify", "--config", str(settings)]
    assert renamed(["verify", "--config", str(model)]) == ["verify", "--model-config", str(model)]
    assert renamed(["verify", "--config=qwen3-gqa3-hd64"]) == ["verify", "--model-config=qwen3-gqa3-hd64"]


def test_every_alias_is_listed() -> None:
    found = {}
    for name, command in _commands().items():
        for param in command.params:
            names = [opt for opt in getattr(param, "opts", []) if opt.startswith("--")]
            if len(names) > 1:
                found[(name, names[0])] = names[1]
    assert found == ALIASES


def test_a_list_takes_commas_and_its_singular_alias(tmp_path: Path) -> None:
    common = [BURST, "--device", "none", "--json", "-"]
    plural = runner.invoke(app, ["profile", *common, "--block-sizes", "16,64"])
    singular = runner.invoke(app, ["profile", *common, "--block-size", "16", "--block-size", "64"])
    assert plural.exit_code == singular.exit_code == 0, plural.stderr
    assert [r["block_size"] for r in json.loads(plural.stdout)["rows"]] == [16, 64]
    assert json.loads(plural.stdout) == json.loads(singular.stdout)


def test_every_option_of_every_command_is_under_a_panel() -> None:
    missing = []
    for name, command in _commands().items():
        for param in command.params:
            if param.param_type_name == "option" and param.name not in PANELS and param.name != "help":
                missing.append(f"{name} --{param.name.replace('_', '-')}")
    assert missing == [], "add them to PANELS in cli/grammar.py"


def test_every_command_has_two_or_three_examples() -> None:
    for name, command in _commands().items():
        examples = [part for part in command.epilog.split("\n\n") if part.strip().startswith("minipaged")]
        assert 2 <= len(examples) <= 3, name


def test_print_config_writes_a_file_that_config_reads_back(tmp_path: Path) -> None:
    flags = [BURST, "--strategies", "paged", "--kv-memory", "1GiB", "--no-prefix-caching"]
    printed = runner.invoke(app, ["simulate", *flags, "--print-config"])
    assert printed.exit_code == 0, printed.stderr
    settings = yaml.safe_load(printed.stdout)
    assert settings["trace"] == BURST and settings["kv-memory"] == "1GiB" and settings["prefix-caching"] is False
    path = tmp_path / "settings.yaml"
    path.write_text(printed.stdout)
    direct = runner.invoke(app, ["simulate", *flags, "--json", "-"])
    from_file = runner.invoke(app, ["simulate", "--config", str(path), "--json", "-"])
    assert direct.exit_code == from_file.exit_code == 0, from_file.stderr
    assert json.loads(direct.stdout) == json.loads(from_file.stdout)


def test_the_command_line_overrides_the_settings_file(tmp_path: Path) -> None:
    path = tmp_path / "settings.yaml"
    path.write_text(f"trace: {BURST}\nkv-memory: 1GiB\nstrategies: [paged, dynamic]\n")
    result = runner.invoke(app, ["simulate", "--config", str(path), "--strategies", "paged", "--print-config"])
    settings = yaml.safe_load(result.stdout)
    assert settings["strategies"] == "paged" and settings["kv-memory"] == "1GiB"


@pytest.mark.parametrize(("text", "message"), [
    ("bogus: 1\n", "bogus: not an option of 'minipaged simulate'"),
    ("- a list\n", "expected a mapping"),
    ("block-size: abc\n", "bad.yaml: block-size: 'abc': Input should be a valid integer"),
])
def test_a_bad_settings_file_is_one_line_and_exit_2(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    result = runner.invoke(app, ["simulate", MIXED, "--config", str(path)])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and message in result.stderr


def test_sweep_prints_its_own_settings_file_under_the_command_line(tmp_path: Path) -> None:
    path = tmp_path / "sweep.yaml"
    path.write_text("rates: [1, 2]\nstrategies: [paged]\nseeds: 2\n")
    result = runner.invoke(app, ["sweep", BURST, "--config", str(path), "--seeds", "3", "--print-config"])
    assert result.exit_code == 0, result.stderr
    settings = yaml.safe_load(result.stdout)
    assert settings["rates"] == [1, 2] and settings["seeds"] == 3


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"minipaged {__version__}"


def test_simulate_without_a_trace_names_the_bundled_ones() -> None:
    result = runner.invoke(app, ["simulate"])
    assert result.exit_code == 2
    assert "traces/mixed.yaml" in result.stderr and result.stderr.count("\n") == 1


# The engine's options: every command that runs the engine takes each (and refuses in one line what it cannot honour).
ENGINE_OPTIONS = ("--kv-memory", "--num-blocks", "--gpu-memory-utilization", "--max-model-len", "--max-num-seqs",
                  "--prefix-caching", "--hybrid-kv",
                  "--max-batched-tokens", "--scheduler", "--watermark", "--kv-cache-dtype", "--cpu-kv-memory",
                  "--disk-kv-memory", "--offload-policy", "--tier-eviction", "--tier-inclusion", "--layerwise-loads",
                  "--vllm-version")
ENGINE_COMMANDS = ("simulate", "sweep", "run", "profile")


@pytest.mark.parametrize("name", ENGINE_COMMANDS)
def test_every_engine_command_takes_every_engine_option(name: str) -> None:
    command = _commands()[name]
    options = {opt for param in command.params for opt in getattr(param, "opts", [])}
    assert set(ENGINE_OPTIONS) - options == set()


@pytest.mark.parametrize(("args", "message"), [
    (["profile", BURST, "--device", "none", "--cpu-kv-memory", "64GiB"], "--cpu-kv-memory: '64GiB': profile compares"),
    (["sweep", BURST, "--rates", "1", "--num-blocks", "100"], "--num-blocks: 100: sweep sizes each point's KV"),
    (["sweep", BURST, "--rates", "1", "--disk-kv-memory", "1TiB"], "--disk-kv-memory: '1TiB': sweep's points"),
    (["sweep", BURST, "--rates", "1", "--vllm-version", "0.33"], "--vllm-version: '0.33': sweep's points follow"),
])
def test_an_engine_option_a_command_cannot_honour_is_refused_in_one_line(args: list[str], message: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and message in result.stderr
