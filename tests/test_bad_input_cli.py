"""Bad command-line input of the commands' contract: one line on stderr, exit 2, and refused before the work."""

from __future__ import annotations

from pathlib import Path

import pytest
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
     "minipaged_cli.apps.calibrate.from_vidur"),
    (["calibrate", "-", "--model", "llama-2-7b", "--gpu", "h100", "--from-vidur", VIDUR, "--json", "BAD"], "--json",
     "minipaged_cli.apps.calibrate.from_vidur"),
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
