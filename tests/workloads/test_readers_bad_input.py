"""Bad traces and bad trace options: each is refused with one line naming the file or option, the field and the
value (exit 2 on the command line), never passed on to hang the replay, print `nan` or end in a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from minipaged_cli.cli.flags import error_line
from minipaged_cli.cli.main import app
from minipaged_cli.errors import InputError
from minipaged_cli.workloads.readers import load_trace
from tests.conftest import ROOT

runner = CliRunner()
MIXED = ROOT / "traces" / "mixed.yaml"
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# (file name, content, what the one line must name)
BAD_FILES = [
    # json.loads reads NaN and Infinity; a NaN arrival never compares <= now, so the replay waited for it forever
    ("m.jsonl", '{"timestamp": NaN, "input_length": 10, "output_length": 2}\n', "line 1: timestamp: nan: must be a"
     " finite number"),
    ("m.jsonl", '{"timestamp": Infinity, "input_length": 10, "output_length": 2}\n', "timestamp: inf"),
    ("m.jsonl", '{"timestamp": -1, "input_length": 10, "output_length": 2}\n', "timestamp: -1: must be >= 0"),
    ("m.jsonl", '{"timestamp": 0, "input_length": 10.5, "output_length": 2}\n', "input_length: 10.5: must be a whole"),
    ("m.jsonl", '{"timestamp": 0, "input_length": 10, "output_length": NaN}\n', "output_length: nan"),
    ("a.csv", AZURE_HEADER + "2023-11-16 18:15:46.68,nan,2\n", "line 2: ContextTokens: nan: must be a whole number"),
    ("a.csv", AZURE_HEADER + "2023-11-16 18:15:46.68,12,\n", "GeneratedTokens: '': must be a whole number"),
    ("l.csv", "prompt_tokens,output_tokens\n12,inf\n", "line 2: output_tokens: inf: must be a whole number"),
    ("t.yaml", "requests:\n  - {id: a, arrival_s: .nan, prompt_tokens: 5, output_tokens: 2}\n",
     "arrival_s: nan: must be a finite number"),
    ("t.yaml", "requests:\n  - {id: a, arrival_s: .inf, prompt_tokens: 5, output_tokens: 2}\n", "arrival_s: inf"),
    ("t.yaml", "requests:\n  - {id: a, arrival_s: 0, prompt_tokens: .inf, output_tokens: 2}\n",
     "prompt_tokens: inf: must be a whole number"),
    ("t.yaml", "generate:\n  - {count: 3, arrival: {process: constant, rate_per_s: 1.0e-310},\n"
               "     prompt_tokens: {dist: constant, value: 3}, output_tokens: {dist: constant, value: 3}}\n",
     "generate[0].arrival: rate_per_s: 1e-310: arrival times overflow to infinity"),
]


@pytest.mark.parametrize(("name", "text", "needle"), BAD_FILES)
def test_bad_trace_values_are_refused_naming_file_line_field_value(tmp_path: Path, name: str, text: str,
                                                                   needle: str) -> None:
    path = write(tmp_path, name, text)
    with pytest.raises(InputError) as caught:
        load_trace(path)
    line = str(caught.value)
    assert "\n" not in line and line.startswith(str(path)) and needle in line


# (options, what the one line must name)
BAD_OPTIONS = [
    ({"time_scale": float("inf")}, "--time-scale: inf: must be a finite number"),
    ({"time_scale": float("nan")}, "--time-scale: nan"),
    ({"time_scale": 0.0}, "--time-scale: 0.0: must be > 0"),
    ({"time_scale": -2.0}, "--time-scale: -2.0: must be > 0"),
    ({"rate": float("inf")}, "--rate: inf: must be a finite number"),
    ({"rate": 0.0}, "--rate: 0.0: must be > 0"),
    ({"rate": 1.0, "seed": -1}, "--seed: -1: must be >= 0"),
    ({"seed": 1.5}, "--seed: 1.5: must be a whole number"),
    ({"limit": 0}, "--limit: 0: must be >= 1"),
    ({"limit": 2.5}, "--limit: 2.5: must be a whole number"),
    # 1 / 1e-310 overflows: every gap, so every arrival, is infinite (a table of nan, then exit 1 on --json)
    ({"rate": 1e-310}, "--rate: 1e-310: arrival times overflow to infinity"),
    ({"time_scale": 1e308}, "--time-scale: 1e+308: arrival times overflow to infinity"),
]


@pytest.mark.parametrize(("options", "needle"), BAD_OPTIONS)
def test_bad_trace_options_are_refused_naming_the_option(options: dict, needle: str) -> None:
    with pytest.raises(InputError) as caught:
        load_trace(MIXED, **options)
    assert needle in error_line(caught.value)  # (the library names the setting; the CLI's line, its flag)


@pytest.mark.parametrize(("args", "needle"), [
    (["simulate", str(MIXED), "--rate", "1", "--seed", "-1"], "--seed: -1: must be >= 0"),
    (["simulate", str(MIXED), "--time-scale", "inf"], "--time-scale: inf: must be a finite number"),
    (["simulate", str(MIXED), "--rate", "1e-310", "--json", "-"], "--rate: 1e-310"),
    (["simulate", str(ROOT / "traces")], "traces: is a directory; expected a trace file"),
    (["convert", str(MIXED), "out.yaml", "--rate", "1", "--seed", "-1"], "--seed: -1: must be >= 0"),
])
def test_bad_trace_options_on_the_command_line_are_one_line_and_exit_2(args: list[str], needle: str) -> None:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], result.stderr
    assert "Traceback" not in result.output
