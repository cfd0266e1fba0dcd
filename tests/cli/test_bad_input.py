"""Bad command-line input of the commands' contract: one line on stderr, exit 2, and refused before the work."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from minipaged_cli.cli.main import app
from tests.conftest import ROOT

runner = CliRunner()
MIXED = str(ROOT / "traces" / "mixed.yaml")
VIDUR = str(ROOT / "tests" / "data" / "vidur_h100_llama-2-7b_mlp.csv")


def _never(*args: object, **kwargs: object) -> None:
    raise AssertionError("the work started before the output path was checked")


# (arguments with BAD for the unwritable path, the option reported, the first step of the work, poisoned)
OUTPUT_CASES = [
    (["simulate", MIXED, "--json", "BAD"], "--json", "minipaged_cli.cli.simulate.load_trace"),
    (["simulate", MIXED, "--plot", "BAD"], "--plot", "minipaged_cli.cli.simulate.load_trace"),
    (["simulate", MIXED, "--plot-layout", "BAD"], "--plot-layout", "minipaged_cli.cli.simulate.load_trace"),
    (["run", MIXED, "--device", "cpu", "--json", "BAD"], "--json", "minipaged_cli.cli.run.load_trace"),
    (["run", MIXED, "--device", "cpu", "--plot", "BAD"], "--plot", "minipaged_cli.cli.run.load_trace"),
    (["profile", MIXED, "--device", "none", "--json", "BAD"], "--json", "minipaged_cli.cli.profile.load_trace"),
    (["profile", MIXED, "--device", "none", "--plot", "BAD"], "--plot", "minipaged_cli.cli.profile.load_trace"),
    (["convert", MIXED, "BAD.yaml"], "OUTPUT", "minipaged_cli.cli.convert.load_trace"),
    (["calibrate", "BAD.yaml", "--model", "llama-2-7b", "--gpu", "h100", "--from-vidur", VIDUR], "OUT",
     "minipaged_cli.apps.vidur.from_vidur"),
    (["calibrate", "-", "--model", "llama-2-7b", "--gpu", "h100", "--from-vidur", VIDUR, "--json", "BAD"], "--json",
     "minipaged_cli.apps.vidur.from_vidur"),
    (["verify", "--device", "cpu", "--json", "BAD"], "--json", "minipaged_cli.apps.qwen3.build_random_qwen3"),
]


@pytest.mark.parametrize(("args", "option", "first_step"), OUTPUT_CASES,
                         ids=[f"{a[0]} {o}" for a, o, _ in OUTPUT_CASES])
@pytest.mark.parametrize("bad", ["missing-dir", "a-directory"])
def test_an_unwritable_output_is_refused_before_the_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         args: list[str], option: str, first_step: str,
                                                         bad: str) -> None:
    monkeypatch.setattr(first_step, _never)
    (arg,) = (a for a in args if a.startswith("BAD"))
    name = "out" + arg[3:]
    if bad == "a-directory":
        (tmp_path / name).mkdir()
        path = tmp_path / name
    else:
        path = tmp_path / "no" / name
    result = runner.invoke(app, [str(path) if a == arg else a for a in args])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: {option}: '{path}'"), lines[0]
    assert ("no such directory" if bad == "missing-dir" else "is a directory") in lines[0], lines[0]
    assert [p.name for p in tmp_path.rglob("*")] == ([name] if bad == "a-directory" else [])


# -- optional dependencies (pyproject.toml's extras) ---------------------------------------------------------

def test_the_core_commands_import_nothing_from_the_extras(tmp_path: Path) -> None:
    # Each extra's modules made unimportable, as in an install without extras: any import of one by simulate,
    # sweep, convert, profile --device none or calibrate --from-vidur would end that command with exit 2 "needs ...".
    code = f"""
import sys
from minipaged_cli.extras import EXTRAS
for module in EXTRAS:
    sys.modules[module] = None
from minipaged_cli.cli.main import app
for args in ({["simulate", MIXED]!r}, {["convert", MIXED, str(tmp_path / "out.yaml"), "--limit", "3"]!r},
             {["sweep", MIXED, "--rates", "1,2", "--strategies", "paged", "--workers", "1", "--limit", "20"]!r},
             {["profile", MIXED, "--device", "none", "--block-size", "16", "--limit", "20"]!r},
             {["calibrate", str(tmp_path / "cal.yaml"), "--model", "llama-2-7b", "--gpu", "h100", "--from-vidur",
               VIDUR]!r}):
    code = app(args, standalone_mode=False)
    assert code in (None, 0), (args, code)
    print("done:", args[0])
"""
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    done = [line.split()[1] for line in result.stdout.splitlines() if line.startswith("done: ")]
    assert done == ["simulate", "convert", "sweep", "profile", "calibrate"]


@pytest.mark.parametrize(("missing", "args", "extra"), [
    ("torch", ["run", MIXED, "--device", "cpu"], "torch"),
    ("torch", ["profile", MIXED, "--device", "cpu", "--block-size", "16"], "torch"),
    ("torch", ["verify", "--device", "cpu"], "torch"),
    ("torch", ["calibrate", "out.yaml", "--device", "cpu", "--quick"], "torch"),
    ("transformers", ["verify", "--device", "cpu"], "torch"),
    ("matplotlib", ["simulate", MIXED, "--plot-layout", "layout.png", "--strategies", "paged"], "plot"),
])
def test_a_command_that_needs_a_missing_extra_names_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        missing: str, args: list[str], extra: str) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setitem(sys.modules, missing, None)  # what an import of a module that is not installed meets
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1, result.stderr
    assert f'needs {missing}, which is not installed: pip install -e ".[{extra}]"' in result.stderr
    if extra == "torch":
        assert "pip install torch --index-url https://download.pytorch.org/whl/cpu" in result.stderr
    assert not list(tmp_path.iterdir())


def test_a_plot_without_matplotlib_is_refused_before_the_replay(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    monkeypatch.setattr("minipaged_cli.cli.simulate.load_trace", _never)
    for command in (["simulate", MIXED], ["profile", MIXED, "--device", "none"], ["sweep", MIXED, "--rates", "1"]):
        result = runner.invoke(app, [*command, "--plot", str(tmp_path / "p.png")])
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith("error: Invalid value for '--plot': needs matplotlib"), result.stderr
        assert 'pip install -e ".[plot]"' in result.stderr and result.stderr.count("\n") == 1


def test_device_auto_on_a_gpu_without_pycuda_says_it_runs_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "pycuda", None)
    result = runner.invoke(app, ["run", MIXED, "--device", "auto", "--limit", "2", "--num-layers", "1",
                                 "--max-steps", "2", "--kv-memory", "1GiB"])
    assert result.exit_code == 0, result.output
    notes = [line for line in result.stderr.splitlines() if line.startswith("note:")]
    assert notes == ['note: --device auto runs on the CPU: a GPU is here but PyCUDA is not installed '
                     '(pip install -e ".[gpu]")'], result.stderr
    assert "Data plane on cpu" in result.stdout


def test_device_auto_without_a_gpu_says_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    result = runner.invoke(app, ["run", MIXED, "--device", "auto", "--limit", "2", "--num-layers", "1",
                                 "--max-steps", "2", "--kv-memory", "1GiB"])
    assert result.exit_code == 0, result.output
    assert "note:" not in result.stderr


# -- boolean options -----------------------------------------------------------------------------------------

def _commands() -> dict[str, Any]:
    return typer.main.get_command(app).commands  # type: ignore[attr-defined]


def test_every_boolean_option_is_a_flag_pair_shown_without_a_value_type() -> None:
    flags = []
    for name, command in _commands().items():
        for param in command.params:
            if getattr(param, "is_flag", False) and param.name != "print_config":  # an action, as --help is
                flags.append(param.opts[0])
                # Typer's documented style for a boolean: --NAME sets it, --no-NAME clears it
                assert param.secondary_opts == ["--no-" + param.opts[0][2:]], (name, param.opts)
        result = runner.invoke(app, [name, "--help"], env={"COLUMNS": "200"})
        assert result.exit_code == 0
        assert "<bool>" not in result.output, name  # a flag takes no value: none is shown
    assert {"--prefix-caching", "--check-invariants", "--quick"} <= set(flags)
    assert "<bool>" not in runner.invoke(app, ["--help"]).output


def test_prefix_caching_and_its_negation() -> None:
    base = ["simulate", MIXED, "--strategies", "paged", "--json", "-"]
    on = runner.invoke(app, [*base, "--prefix-caching"])
    off = runner.invoke(app, [*base, "--prefix-caching", "--no-prefix-caching"])  # the last one wins
    assert on.exit_code == 0 and off.exit_code == 0, on.output + off.output
    assert json.loads(on.stdout)["config"]["prefix_caching"] is True
    assert json.loads(off.stdout)["config"]["prefix_caching"] is False


# -- user text printed through Rich markup ---------------------------------------------------------------------

def test_names_with_markup_or_dollars_print_as_themselves(tmp_path: Path) -> None:
    trace = tmp_path / "t.yaml"
    name = "x[/y] [bold]$\\frac$"  # a closing tag Rich cannot match, a tag, and a mathtext formula matplotlib rejects
    trace.write_text(f"name: '{name}'\nrequests:\n"
                     "  - {id: a, arrival_s: 0, prompt_tokens: 40, output_tokens: 5}\n"
                     "  - {id: b, arrival_s: 0.1, prompt_tokens: 30, output_tokens: 9}\n")
    png = tmp_path / "p.png"
    for args in (["simulate", str(trace), "--strategies", "paged", "--plot", str(png)],
                 ["run", str(trace), "--device", "cpu", "--num-layers", "1", "--kv-memory", "1GiB", "--plot", str(png)],
                 ["profile", str(trace), "--device", "none", "--block-size", "16", "--plot", str(png)]):
        png.unlink(missing_ok=True)
        result = runner.invoke(app, args)
        assert result.exit_code == 0, (args[0], result.output)
        assert name in result.stdout, args[0]
        assert png.read_bytes()[:4] == b"\x89PNG", args[0]


def test_a_plot_format_matplotlib_cannot_write_is_refused_before_the_replay(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("minipaged_cli.cli.simulate.load_trace", _never)
    result = runner.invoke(app, ["simulate", MIXED, "--plot", str(tmp_path / "memory.xyz")])
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith("error: Invalid value for '--plot': matplotlib writes no .xyz files; expected "
                                    ".png"), result.stderr
    assert not list(tmp_path.iterdir())


def test_a_plot_path_without_a_suffix_gets_a_png(tmp_path: Path) -> None:
    path = tmp_path / "memory"
    result = runner.invoke(app, ["simulate", MIXED, "--strategies", "paged", "--plot", str(path)])
    assert result.exit_code == 0, result.output
    assert path.read_bytes()[:4] == b"\x89PNG"
    assert [p.name for p in tmp_path.iterdir()] == ["memory"]  # and no temporary left beside it


@pytest.mark.parametrize("option", ["--model", "--gpu", "--calibration", "--config"])
def test_a_file_that_is_not_text_is_one_line_exit_2(tmp_path: Path, option: str) -> None:
    path = tmp_path / ("config.json" if option == "--model" else "file.yaml")
    path.write_bytes(b"\xff\xfe\x00{")
    command = ["sweep", MIXED] if option == "--config" else ["simulate", MIXED]
    result = runner.invoke(app, [*command, option, str(path)])
    assert result.exit_code == 2, result.output
    line, = result.output.strip().splitlines()
    assert line.startswith(f"error: {path}: ") and "cannot read: 'utf-8' codec can't decode" in line, line
