"""Input files the project reads (input_files.py, the trace readers): a repeated key is refused naming the file, the
key and its line; a count past what any sequence can hold is refused where it is read, one line, exit 2."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from minipaged_cli.cli.main import app
from minipaged_cli.cli.sweep_options import read_config
from minipaged_cli.errors import InputError
from minipaged_cli.input_files import MAX_YAML_DEPTH, parse_json, parse_yaml, read_document, read_json_lines
from minipaged_cli.sim.calibration import load_calibration
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import replay
from minipaged_cli.validation import MAX_TOKENS
from minipaged_cli.workloads.presets import GpuSpec, ModelSpec, load_gpu, load_model
from minipaged_cli.workloads.readers import load_trace
from minipaged_cli.workloads.trace import Request, make_trace
from tests.conftest import ROOT

runner = CliRunner()
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
HUGE = 2**62  # 4611686018427387904: a list of its blocks' keys would not fit in memory


def one_line_exit_2(args: list[str]) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 2, result.output
    line, = result.output.strip().splitlines()
    return line


# -- duplicate keys ----------------------------------------------------------------------------------------------

def test_a_trace_repeating_a_key_is_refused_naming_the_file_the_key_and_its_line(tmp_path: Path) -> None:
    # PyYAML keeps the last value: this ran with 5,000 output tokens.
    path = tmp_path / "t.yaml"
    path.write_text("requests:\n  - {id: a, arrival_s: 0, prompt_tokens: 10,\n"
                    "     output_tokens: 10, output_tokens: 5000}\n")
    line = one_line_exit_2(["simulate", str(path)])
    assert line == f"error: {path}: line 3: output_tokens: duplicate key (first on line 3); write each key once"
    path.write_text("name: a\nrequests:\n  - id: a\n    arrival_s: 0\n    prompt_tokens: 10\n    output_tokens: 10\n"
                    "name: b\n")
    assert one_line_exit_2(["simulate", str(path)]).endswith("line 7: name: duplicate key (first on line 1); "
                                                             "write each key once")


def write_with_repeat(path: Path, text: str, repeat: str) -> Path:
    """``text`` with ``repeat`` (one of its lines) written again at the end."""
    assert repeat in text.splitlines()
    path.write_text(text.rstrip("\n") + "\n" + repeat + "\n")
    return path


@pytest.mark.parametrize(("preset", "repeat", "load"), [
    ("gpus/h200.yaml", "peak_flops: 989.0e+12", load_gpu),
    ("models/qwen3-8b.yaml", "num_key_value_heads: 8", load_model),
    ("calibrations/h100-llama-2-7b.yaml", "gpu: h100", load_calibration),
])
def test_a_config_repeating_a_key_is_refused(tmp_path: Path, preset: str, repeat: str, load: object) -> None:
    text = (ROOT / "configs" / preset).read_text()
    path = write_with_repeat(tmp_path / Path(preset).name, text, repeat)
    key = repeat.partition(":")[0]
    with pytest.raises(InputError) as caught:
        load(str(path))  # type: ignore[operator]
    first = text.splitlines().index(repeat) + 1
    assert str(caught.value) == (f"{path}: line {len(text.splitlines()) + 1}: {key}: duplicate key (first on line "
                                 f"{first}); write each key once")


def test_a_sweep_config_and_a_json_config_repeating_a_key_are_refused(tmp_path: Path) -> None:
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text("rates: [1]\nstrategies: [paged]\nrates: [2]\n")
    with pytest.raises(InputError, match=r"sweep.yaml: line 3: rates: duplicate key \(first on line 1\)"):
        read_config(sweep)
    config = tmp_path / "config.json"
    config.write_text('{"model_type": "qwen3",\n "rope_scaling": {"type": "yarn",\n  "type": "linear"}}\n')
    with pytest.raises(InputError) as caught:
        load_model(str(config))
    assert str(caught.value) == f"{config}: line 3: type: duplicate key (first on line 2); write each key once"


def test_a_mooncake_line_repeating_a_key_is_refused_naming_its_line(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 10, "output_length": 2}\n'
                    '{"timestamp": 5, "input_length": 10, "output_length": 2, "output_length": 900}\n')
    with pytest.raises(InputError) as caught:
        load_trace(path)
    assert str(caught.value) == f"{path}: line 2: output_length: duplicate key; write each key once"


def test_a_jsonl_trace_saved_with_a_byte_order_mark_is_refused_as_json_loads_refuses_it(tmp_path: Path) -> None:
    # (the reader's one shared decoder skips json.loads's own check: the message must stay json.loads's)
    line = '{"timestamp": 0, "input_length": 10, "output_length": 2}'
    path = tmp_path / "m.jsonl"
    path.write_text(line + "\n", encoding="utf-8-sig")
    with pytest.raises(json.JSONDecodeError) as reference:
        json.loads("\ufeff" + line)
    with pytest.raises(InputError) as caught:
        load_trace(path)
    assert str(caught.value) == f"{path}: line 1: not valid JSON: {reference.value.msg}"


def test_what_is_not_a_repeat_still_reads() -> None:
    # A merge key (<<) may be overridden; equal keys in different mappings are no repeat.
    assert parse_yaml("x: &x {a: 1, b: 2}\ny:\n  <<: *x\n  a: 3\n", "f") == {"x": {"a": 1, "b": 2},
                                                                             "y": {"a": 3, "b": 2}}
    assert parse_json('{"a": {"k": 1}, "b": {"k": 2}}', "f") == {"a": {"k": 1}, "b": {"k": 2}}
    # 1 and 1.0 (and true) are one key to Python: PyYAML would keep one of them silently
    with pytest.raises(InputError, match="duplicate key"):
        parse_yaml("{1: a, 1.0: b}", "f")


# -- what a parser cannot take -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("name", "text", "says"), [
    # libyaml builds nodes by C recursion: 30,000 levels were a segfault
    ("deep.yaml", "[" * 30_000, f"line 1: nested more than {MAX_YAML_DEPTH} levels deep"),
    ("deep.yaml", "- " * 30_000 + "1", f"line 1: nested more than {MAX_YAML_DEPTH} levels deep"),
    ("deep.json", "[" * 30_000, "not valid JSON: maximum recursion depth exceeded"),
    ("digits.yaml", "a: " + "9" * 5000, "not valid YAML: Exceeds the limit (4300 digits)"),
    ("digits.json", '{"a": ' + "9" * 5000 + "}", "not valid JSON: Exceeds the limit (4300 digits)"),
    ("date.yaml", "a: 2001-13-45", "not valid YAML: month must be in 1..12"),
    # a repeat nested deeper than the pure-Python scanner that finds its lines can go: the key, without them
    ("deep_repeat.json", "[" * 600 + '{"a": 1, "a": 2}' + "]" * 600, "a: duplicate key; write each key once"),
])
def test_a_document_the_parser_cannot_take_is_bad_input(tmp_path: Path, name: str, text: str, says: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InputError) as caught:
        read_document(path)
    assert str(caught.value).startswith(f"{path}: {says}"), caught.value


@pytest.mark.parametrize(("name", "content", "says"), [
    ("a.csv", AZURE_HEADER.encode() + b"2023-11-16 18:15:46.68,12,\xff\n", "cannot read: 'utf-8' codec can't decode"),
    ("l.csv", f"prompt_tokens,output_tokens\n{'1' * 200_000},5\n".encode(), "not valid CSV: field larger than"),
    ("m.jsonl", b'{"timestamp": 0, "input_length": 10, "output_length": 2}\n\xff\n', "cannot read: 'utf-8' codec"),
])
def test_a_trace_file_that_is_not_text_or_csv_is_bad_input(tmp_path: Path, name: str, content: bytes,
                                                            says: str) -> None:
    path = tmp_path / name
    path.write_bytes(content)
    line = one_line_exit_2(["simulate", str(path)])
    assert line.startswith(f"error: {path}: {says}"), line


# -- huge counts -------------------------------------------------------------------------------------------------

def test_a_huge_prompt_is_one_line_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(f"requests:\n  - {{id: a, arrival_s: 0, prompt_tokens: {HUGE}, output_tokens: 5}}\n")
    assert one_line_exit_2(["simulate", str(path)]) == (
        f"error: {path}: requests[0] (id a): prompt_tokens: {HUGE}: must be <= {MAX_TOKENS} (2**31 - 1: vLLM's "
        "token positions are int32)")


GROUP = "generate:\n  - {{count: {count}, arrival: {{process: poisson, rate_per_s: 1}}, prompt_tokens: {prompt},\n" \
        "     output_tokens: {{dist: constant, value: 3}}{extra}}}\n"


@pytest.mark.parametrize(("group", "says"), [
    ({"prompt": f"{{dist: constant, value: {HUGE}}}"}, f"value: {HUGE}: must be <= {MAX_TOKENS}"),
    ({"prompt": f"{{dist: uniform, low: 1, high: {HUGE}}}"}, f"high: {HUGE}: must be <= {MAX_TOKENS}"),
    ({"prompt": f"{{dist: lognormal, median: 600, sigma: 1, max: {HUGE}}}"}, f"max: {HUGE}: must be <= "),
    ({"prompt": f"{{dist: lognormal, median: 600, sigma: 1, min: {HUGE}}}"}, f"min: {HUGE}: must be <= "),
    # without a max the sampled counts are the check: a median of 1e300 samples counts past any bound
    ({"prompt": "{dist: lognormal, median: 1.0e+300, sigma: 1}"}, "max: a sampled count exceeds 2147483647"),
    ({"prompt": "{dist: normal, mean: 1.0e+300, std: 1.0e+300}"}, "max: a sampled count exceeds 2147483647"),
    ({"prompt": "{dist: lognormal, median: .inf, sigma: 1}"}, "median: inf: must be a finite number"),
    ({"prompt": "{dist: normal, mean: 600, std: .nan}"}, "std: nan: must be a finite number"),
    ({"count": HUGE}, f"generate[0]: count: {HUGE}: must be <= 1000000"),
    ({"extra": f", n: {HUGE}"}, f"generate[0]: n: {HUGE}: must be <= 1000000"),
])
def test_huge_or_non_finite_generated_counts_are_refused_where_read(tmp_path: Path, group: dict,
                                                                     says: str) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(GROUP.format(**({"count": 3, "prompt": "{dist: constant, value: 3}", "extra": ""} | group)))
    with pytest.raises(InputError) as caught:
        load_trace(path)
    assert says in str(caught.value) and str(caught.value).startswith(str(path)), caught.value


def test_a_sampled_count_clipped_to_the_max_written_reads(tmp_path: Path) -> None:
    path = tmp_path / "g.yaml"
    path.write_text(GROUP.format(count=4, prompt="{dist: lognormal, median: 1.0e+300, sigma: 1, max: 4096}",
                                 extra=""))
    assert [r.prompt_tokens for r in load_trace(path).requests] == [4096] * 4


@pytest.mark.parametrize(("name", "text", "says"), [
    ("a.csv", AZURE_HEADER + f"2023-11-16 18:15:46.68,{HUGE},2\n", f"line 2: ContextTokens: {HUGE}: must be <= "),
    ("m.jsonl", f'{{"timestamp": 0, "input_length": 10, "output_length": {HUGE}}}\n',
     f"line 1: output_length: {HUGE}: must be <= "),
    ("l.csv", f"num_prefill_tokens,num_decode_tokens\n{HUGE},5\n", f"line 2: num_prefill_tokens: {HUGE}: must be"),
    ("t.yaml", f"segments: {{s: {HUGE}}}\nrequests: [{{id: a, arrival_s: 0, prompt_tokens: 5, output_tokens: 2}}]\n",
     f"segments: s: {HUGE}: must be <= "),
])
def test_huge_counts_in_every_reader_are_refused(tmp_path: Path, name: str, text: str, says: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    assert one_line_exit_2(["simulate", str(path)]).startswith(f"error: {path}: {says}")


def test_a_request_longer_than_the_model_is_rejected_before_its_keys_are_built(tiny_model: ModelSpec,
                                                                                clock_gpu: GpuSpec) -> None:
    # The longest count a trace may hold, under prefix caching (every block keyed): 134 M keys were built before
    # the length was checked. Now it is one rejection, and the other request runs.
    trace = make_trace("t", [Request("a", 0.0, MAX_TOKENS - 1, 1), Request("b", 0.0, 10, 2)], source="test")
    config = SimConfig.of(tiny_model, clock_gpu, num_blocks=16, block_size=16, prefix_caching=True)
    result = replay(trace, config, "paged")
    assert (result.completed_requests, result.rejected_requests) == (1, 1)


@pytest.mark.parametrize("key", ["hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size"])
def test_a_model_shape_past_int32_is_one_line_exit_2(tmp_path: Path, key: str) -> None:
    # Read as a whole number, 10**400 went on to the KV pool's size, a float: "internal error: OverflowError".
    config = yaml.safe_load((ROOT / "configs" / "models" / "qwen3-8b.yaml").read_text()) | {key: 10**400}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    trace = tmp_path / "t.yaml"
    trace.write_text("requests: [{id: a, arrival_s: 0, prompt_tokens: 20, output_tokens: 3}]\n")
    line = one_line_exit_2(["simulate", str(trace), "--model", str(path), "--strategies", "paged"])
    assert line == f"error: {path}: {key}: {10**400}: must be <= {2**31 - 1}"


# -- JSON lines --------------------------------------------------------------------------------------------------

def json_lines_one_by_one(path: Path) -> list[tuple[str, Any]]:
    """The reference: each line that is not blank through ``parse_json``, an object required."""
    rows = []
    for number, text in enumerate(path.read_text(encoding="utf-8").split("\n"), start=1):
        if text.strip():
            row = parse_json(text, str(path), f"line {number}")
            if not isinstance(row, dict):
                raise InputError("expected a JSON object", source=str(path), where=f"line {number}")
            rows.append((f"line {number}", row))
    return rows


line_pieces = st.sampled_from([
    '{"a": 1, "b": [2, 3]}', '{}', '{"a": {"b": {}}}', '{"a": 1, "a": 2}', '{"a": {"k": 1, "k": 2}}', '[1, 2]', '7',
    '"text"', 'null', '{"a": 1', '{"a": 1}}', '{"a": 1} {"b": 2}', '{"a": 1},', '{"a": NaN}', '{"a": 1e999}',
    "{'a': 1}", '{"a": "\u2028"}', '{"a": 1 }', '{ "a": 1}', '{"a":\n1}', '', ' ', '\r', '\t', '\x0b', '\ufeff',
    '\u2028', '\x85', 'x'])


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(st.lists(line_pieces, min_size=1, max_size=3).map("".join), max_size=5))
@example(lines=['{"a": 1}\r', ' {"a": 1}', '{"a": 1} ', '\x0b'])
def test_json_lines_read_as_each_line_parsed_alone(tmp_path_factory: pytest.TempPathFactory,
                                                     lines: list[str]) -> None:
    # The reader scans a line holding one object alone at once; every other line goes through parse_json: the
    # rows, and the refusal of a bad line, are those of each line parsed alone
    path = tmp_path_factory.mktemp("j") / "t.jsonl"
    path.write_text("\n".join(lines), encoding="utf-8", newline="")
    try:
        expected: Any = json_lines_one_by_one(path)
    except InputError as error:
        expected = str(error)
    try:
        read: Any = list(read_json_lines(path))
    except InputError as error:
        read = str(error)
    assert read == expected
