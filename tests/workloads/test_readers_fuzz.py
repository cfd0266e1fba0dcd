"""Every reader of a user's file, fuzzed: generated traces (YAML, Azure CSV, Mooncake JSONL, lengths CSV) and
config files (a model's config.json, a GPU YAML, a calibration, a sweep config) with random structures, types,
encodings, huge and non-finite numbers, repeated keys and truncation. Each either loads with the values written
or raises ``InputError`` (one line: exit 2 on the command line), never another exception.

Bounded for CI (100 examples a reader, ~10 s of CPU). The ``@example``s are what the fuzzing found
(each crashed before its fix): they run first, every time.
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from minipaged_cli.cli.main import app
from minipaged_cli.cli.sweep_options import FILE_KEYS, checked, read_config
from minipaged_cli.errors import InputError
from minipaged_cli.sim.calibration import load_calibration
from minipaged_cli.workloads.presets import load_gpu, load_model
from minipaged_cli.workloads.readers import load_trace
from tests.conftest import ROOT

# MINIPAGED_FUZZ_EXAMPLES=5000 fuzzes longer, from a fresh seed each run (CI: 100, the same examples every run).
EXAMPLES = int(os.environ.get("MINIPAGED_FUZZ_EXAMPLES", "100"))
FUZZ = settings(max_examples=EXAMPLES, deadline=None, derandomize="MINIPAGED_FUZZ_EXAMPLES" not in os.environ,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
SPECIAL_NUMBERS = [0, -1, 1, 2**31 - 1, 2**31, 2**62, 2**63, 10**30, 10**400, 1.5, 1e308, -0.0, 5e-324,
                   math.inf, -math.inf, math.nan]
scalars = st.one_of(
    st.integers(-5, 5000), st.integers(), st.sampled_from(SPECIAL_NUMBERS), st.floats(), st.booleans(), st.none(),
    st.text(max_size=12), st.sampled_from(["600", "1e5", "nan", "inf", "", "12.0", "0x10", "1_000", "٣"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=6), inner, max_size=4)),
                      max_leaves=12)
MUTATIONS = ["none", "none", "truncate", "repeat line", "latin-1", "utf-16", "garbage byte", "empty"]


def mutate(text: str, mutation: str, cut: float) -> bytes:
    """The file's bytes: ``text`` as written (UTF-8), or damaged in one way."""
    if mutation == "truncate":
        return text.encode()[:int(len(text.encode()) * cut)]
    if mutation == "repeat line":
        lines = text.splitlines(keepends=True)
        if lines:
            index = int(len(lines) * cut) % len(lines)
            lines.insert(index, lines[index])
        return "".join(lines).encode()
    if mutation in ("latin-1", "utf-16"):
        return (text + " é").encode(mutation, errors="replace")
    if mutation == "garbage byte":
        data = text.encode()
        index = int(len(data) * cut)
        return data[:index] + b"\xff\x00\xfe" + data[index:]
    if mutation == "empty":
        return b""
    return text.encode()


def reads_or_refuses(load: Callable[[Path], Any], path: Path) -> Any | None:
    """What ``load`` reads from ``path``, or None when it refuses it with one line; any other exception fails."""
    try:
        return load(path)
    except InputError as error:
        message = str(error)
        assert len(message.splitlines()) == 1, message
        return None


def written_count(value: Any) -> int | None:
    """A count as the file wrote it, read independently of the project's checks: a whole number, else None."""
    if isinstance(value, str):
        for parse in (int, float):
            try:
                value = parse(value)
                break
            except ValueError:
                continue
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if isinstance(value, float) and not (math.isfinite(value) and value.is_integer()):
        return None
    return int(value)


def write(tmp_path: Path, name: str, data: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


# -- traces ------------------------------------------------------------------------------------------------------

def field(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly a plausible value, sometimes anything."""
    return st.one_of(valid, valid, valid, values)


counts = field(st.integers(1, 5000))
request_entries = st.fixed_dictionaries(
    {"id": field(st.text(min_size=1, max_size=6)), "arrival_s": field(st.floats(0, 100)),
     "prompt_tokens": counts, "output_tokens": counts},
    optional={"n": field(st.integers(1, 4)), "prefix": field(st.just(["s"])), "bogus": values})
lengths = st.one_of(
    st.fixed_dictionaries({"dist": st.just("constant"), "value": counts}, optional={"max": counts}),
    st.fixed_dictionaries({"dist": st.just("uniform"), "low": counts, "high": counts}),
    st.fixed_dictionaries({"dist": st.just("lognormal"), "median": field(st.floats(1, 1e4)),
                           "sigma": field(st.floats(0, 5))}, optional={"max": counts, "min": counts}),
    st.fixed_dictionaries({"dist": st.just("normal"), "mean": field(st.floats(0, 1e4)),
                           "std": field(st.floats(0, 1e3))}, optional={"max": counts}),
    values)
groups = st.fixed_dictionaries(
    {"count": field(st.integers(1, 20)), "prompt_tokens": lengths, "output_tokens": lengths,
     "arrival": st.one_of(st.fixed_dictionaries({"process": st.sampled_from(["poisson", "constant"]),
                                                 "rate_per_s": field(st.floats(0.1, 100))}),
                          st.fixed_dictionaries({"process": st.just("uniform"), "end_s": field(st.floats(0, 10))}),
                          values)},
    optional={"seed": field(st.integers(0, 100)), "n": field(st.integers(1, 4))})
yaml_traces = st.one_of(
    st.fixed_dictionaries({"requests": st.lists(request_entries, min_size=1, max_size=4)},
                          optional={"generate": st.lists(groups, max_size=2), "segments": field(st.just({"s": 3})),
                                    "version": field(st.just(1)), "name": values}),
    st.fixed_dictionaries({"generate": st.lists(groups, min_size=1, max_size=2)}),
    values)


def check_explicit_requests(document: Any, trace: Any) -> None:
    """Every request the document wrote is in the trace with the counts and times written."""
    loaded = {r.id: r for r in trace.requests}
    for entry in document.get("requests") or []:
        request = loaded[str(entry["id"])]
        assert request.prompt_tokens == written_count(entry["prompt_tokens"])
        assert request.output_tokens == written_count(entry["output_tokens"])
        assert request.arrival_s == float(entry["arrival_s"])
        assert request.n == written_count(entry.get("n", 1))


@FUZZ
@given(document=yaml_traces, mutation=st.sampled_from(MUTATIONS), cut=st.floats(0, 1))
@example(document={"requests": [{"id": "a", "arrival_s": 0, "prompt_tokens": 2**62, "output_tokens": 5}]},
         mutation="none", cut=0.0)  # the MemoryError: now refused where read
@example(document={"generate": [{"count": 3, "arrival": {"process": "poisson", "rate_per_s": 1},
                                 "prompt_tokens": {"dist": "lognormal", "median": 1e300, "sigma": 1},
                                 "output_tokens": {"dist": "constant", "value": 3}}]},
         mutation="none", cut=0.0)  # int64 of an overflowed sample: a negative prompt
@example(document=[[[[[[0]]]]]], mutation="none", cut=0.0)
@example(document={"requests": [{"id": "a\u2028b", "arrival_s": 0}]}, mutation="none", cut=0.0)  # a two-line error
def test_yaml_traces(tmp_path_factory: pytest.TempPathFactory, document: Any, mutation: str, cut: float) -> None:
    text = yaml.safe_dump(document)
    path = write(tmp_path_factory.mktemp("t"), "t.yaml", mutate(text, mutation, cut))
    trace = reads_or_refuses(lambda p: load_trace(p, "yaml"), path)
    if trace is not None and mutation == "none":
        check_explicit_requests(document, trace)


cells = st.one_of(st.integers(1, 5000).map(str), st.sampled_from(SPECIAL_NUMBERS).map(str), scalars.map(str))
timestamps = st.one_of(st.just("2023-11-16 18:15:46.6805900"), st.text(max_size=30),
                       st.datetimes().map(lambda d: d.strftime("%Y-%m-%d %H:%M:%S.%f")))


def csv_text(header: list[str], rows: list[list[str]]) -> str:
    out = io.StringIO()
    writer = csv.writer(out)
    writer.writerow(header)
    writer.writerows(rows)
    return out.getvalue()


@FUZZ
@given(rows=st.lists(st.tuples(timestamps, cells, cells), min_size=1, max_size=5),
       mutation=st.sampled_from(MUTATIONS), cut=st.floats(0, 1))
@example(rows=[("2023-11-16 18:15:46.68", "12", "2")], mutation="garbage byte", cut=0.9)  # UnicodeDecodeError
@example(rows=[("2023-11-16 18:15:46.68", "1" * 200_000, "2")], mutation="none", cut=0.0)  # csv's field limit
@example(rows=[("2023-11-16 18:15:46.68", "1", str(10**400))], mutation="none", cut=0.0)  # isfinite: OverflowError
def test_azure_csv(tmp_path_factory: pytest.TempPathFactory, rows: list[tuple[str, str, str]], mutation: str,
                   cut: float) -> None:
    text = csv_text(["TIMESTAMP", "ContextTokens", "GeneratedTokens"], [list(r) for r in rows])
    path = write(tmp_path_factory.mktemp("a"), "a.csv", mutate(text, mutation, cut))
    trace = reads_or_refuses(lambda p: load_trace(p, "azure"), path)
    if trace is not None and mutation == "none":
        loaded = {r.id: r for r in trace.requests}
        for index, (_, prompt, output) in enumerate(rows):
            request = loaded[f"azure-{index}"]
            assert (request.prompt_tokens, request.output_tokens) == (written_count(prompt), written_count(output))


@FUZZ
@given(rows=st.lists(st.tuples(cells, cells), min_size=1, max_size=5),
       header=st.sampled_from([["num_prefill_tokens", "num_decode_tokens"], ["prompt_tokens", "output_tokens"],
                               ["input_length", "output_length"], ["a", "b"]]),
       mutation=st.sampled_from(MUTATIONS), cut=st.floats(0, 1))
def test_lengths_csv(tmp_path_factory: pytest.TempPathFactory, rows: list[tuple[str, str]], header: list[str],
                     mutation: str, cut: float) -> None:
    path = write(tmp_path_factory.mktemp("l"), "l.csv", mutate(csv_text(header, [list(r) for r in rows]), mutation,
                                                                cut))
    trace = reads_or_refuses(lambda p: load_trace(p, "lengths-csv"), path)
    if trace is not None and mutation == "none":
        for index, (prompt, output) in enumerate(rows):
            request = trace.requests[index]  # (every one arrives at 0: the order is the file's)
            assert request.id == f"l-{index}"
            assert (request.prompt_tokens, request.output_tokens) == (written_count(prompt), written_count(output))


json_values = st.recursive(
    st.one_of(st.integers(-5, 5000), st.sampled_from(SPECIAL_NUMBERS), st.floats(), st.booleans(), st.none(),
              st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=5), inner, max_size=3)),
    max_leaves=8)
mooncake_rows = st.one_of(
    st.fixed_dictionaries({"timestamp": field(st.integers(0, 10**6)), "input_length": field(st.integers(1, 5000)),
                           "output_length": field(st.integers(1, 5000))},
                          optional={"hash_ids": field(st.lists(st.integers(0, 50), max_size=4)), "x": json_values}),
    json_values)


@FUZZ
@given(rows=st.lists(mooncake_rows, min_size=1, max_size=4), mutation=st.sampled_from(MUTATIONS),
       cut=st.floats(0, 1))
@example(rows=[{"timestamp": 0, "input_length": 10, "output_length": 2}], mutation="repeat line", cut=0.0)
def test_mooncake_jsonl(tmp_path_factory: pytest.TempPathFactory, rows: list[Any], mutation: str,
                        cut: float) -> None:
    text = "".join(json.dumps(row) + "\n" for row in rows)
    path = write(tmp_path_factory.mktemp("m"), "m.jsonl", mutate(text, mutation, cut))
    trace = reads_or_refuses(lambda p: load_trace(p, "mooncake"), path)
    if trace is not None and mutation == "none":
        loaded = {r.id: r for r in trace.requests}
        for index, row in enumerate(rows):
            request = loaded[f"mooncake-{index}"]
            assert request.prompt_tokens == written_count(row["input_length"])
            assert request.output_tokens == written_count(row["output_length"])
            assert request.arrival_s == float(row["timestamp"]) / 1000.0


# -- config files ------------------------------------------------------------------------------------------------

def preset(kind: str, name: str) -> dict[str, Any]:
    return yaml.safe_load((ROOT / "configs" / kind / f"{name}.yaml").read_text())


# YAML keys need not be text: 1, null, true and 1.5 are keys too
keys_of_any_type = st.one_of(st.text(max_size=8), st.integers(-3, 3), st.none(), st.booleans(), st.floats())


def damaged(base: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """``base`` with some keys given random values, some dropped, some added."""
    keys = sorted(base)
    return st.builds(
        lambda changed, dropped, added: {**{k: v for k, v in base.items() if k not in dropped}, **changed, **added},
        st.dictionaries(st.sampled_from(keys), values, max_size=3), st.sets(st.sampled_from(keys), max_size=2),
        st.dictionaries(keys_of_any_type, values, max_size=2))


QWEN3 = preset("models", "qwen3-8b")
H200 = preset("gpus", "h200")


@FUZZ
@given(config=st.one_of(damaged(QWEN3), values), mutation=st.sampled_from(MUTATIONS), cut=st.floats(0, 1))
def test_model_config_json(tmp_path_factory: pytest.TempPathFactory, config: Any, mutation: str,
                           cut: float) -> None:
    path = write(tmp_path_factory.mktemp("c"), "config.json", mutate(json.dumps(config), mutation, cut))
    model = reads_or_refuses(lambda p: load_model(str(p)), path)
    if model is not None and mutation == "none":
        assert model.num_layers == written_count(config["num_hidden_layers"])
        assert model.hidden_size == written_count(config["hidden_size"])
        assert model.num_q_heads == written_count(config["num_attention_heads"])


@FUZZ
@given(config=st.one_of(damaged(H200), values), mutation=st.sampled_from(MUTATIONS), cut=st.floats(0, 1))
@example(config={**H200, "\n": []}, mutation="none", cut=0.0)  # a key with a line break: a two-line error
@example(config={**H200, "": None, 0: []}, mutation="none", cut=0.0)  # sorted() of an int and a text key
def test_gpu_yaml(tmp_path_factory: pytest.TempPathFactory, config: Any, mutation: str, cut: float) -> None:
    path = write(tmp_path_factory.mktemp("g"), "gpu.yaml", mutate(yaml.safe_dump(config), mutation, cut))
    gpu = reads_or_refuses(lambda p: load_gpu(str(p)), path)
    if gpu is not None and mutation == "none":
        assert gpu.memory_bytes == float(config["memory_bytes"])
        assert gpu.peak_flops == float(config["peak_flops"])


CALIBRATION = yaml.safe_load((ROOT / "configs" / "calibrations" / "h100-llama-2-7b.yaml").read_text())
SMALL_CALIBRATION = {**CALIBRATION, **{name: {column: values[:4] for column, values in table.items()}
                                       for name, table in CALIBRATION.items()
                                       if isinstance(table, dict) and name != "model"}}


@FUZZ
@given(config=st.one_of(damaged(SMALL_CALIBRATION), values),
       table_value=st.tuples(st.sampled_from(["linear", "elementwise"]), st.sampled_from(["tokens", "seconds"]),
                             st.integers(0, 3), values) | st.none(),
       mutation=st.sampled_from(MUTATIONS), cut=st.floats(0, 1))
@example(config={**SMALL_CALIBRATION, "": [], 0: []}, table_value=None, mutation="none", cut=0.0)  # sorted() again
@example(config=SMALL_CALIBRATION, table_value=("linear", "tokens", 0, 10**400), mutation="none",
         cut=0.0)  # a token size past a float's range: OverflowError
def test_calibration(tmp_path_factory: pytest.TempPathFactory, config: Any, table_value: Any, mutation: str,
                     cut: float) -> None:
    if table_value is not None and isinstance(config, dict) and isinstance(config.get(table_value[0]), dict):
        name, column, index, value = table_value
        table = config[name] = dict(config[name])
        if isinstance(table.get(column), list) and index < len(table[column]):
            table[column] = [*table[column][:index], value, *table[column][index + 1:]]
    path = write(tmp_path_factory.mktemp("k"), "cal.yaml", mutate(yaml.safe_dump(config), mutation, cut))
    reads_or_refuses(load_calibration, path)


sweep_configs = st.dictionaries(st.one_of(st.sampled_from([*FILE_KEYS, "bogus", "max-model-len"]), keys_of_any_type),
                                st.one_of(values, st.lists(scalars, min_size=1, max_size=3)), max_size=5)


@FUZZ
@given(config=st.one_of(sweep_configs, values), mutation=st.sampled_from(MUTATIONS), cut=st.floats(0, 1))
def test_sweep_config(tmp_path_factory: pytest.TempPathFactory, config: Any, mutation: str, cut: float) -> None:
    path = write(tmp_path_factory.mktemp("s"), "sweep.yaml", mutate(yaml.safe_dump(config), mutation, cut))

    def load(p: Path) -> dict[str, Any]:
        data = read_config(p)
        return checked(data, set(data), str(p))

    reads_or_refuses(load, path)


# -- the command line --------------------------------------------------------------------------------------------

TINY = "requests:\n  - {id: a, arrival_s: 0, prompt_tokens: 20, output_tokens: 3}\n" \
       "  - {id: b, arrival_s: 0.01, prompt_tokens: 40, output_tokens: 2}\n"


@settings(FUZZ, max_examples=max(12, EXAMPLES // 10))
@given(mutation=st.sampled_from(["truncate", "repeat line", "utf-16", "garbage byte"]), cut=st.floats(0, 1),
       option=st.sampled_from(["trace", "--gpu", "--model", "--calibration"]))
def test_the_command_line_says_one_line_and_exits_2(tmp_path_factory: pytest.TempPathFactory, mutation: str,
                                                    cut: float, option: str) -> None:
    tmp = tmp_path_factory.mktemp("cli")
    trace = write(tmp, "t.yaml", TINY.encode())
    source = {"trace": TINY, "--gpu": (ROOT / "configs" / "gpus" / "h200.yaml").read_text(),
              "--model": json.dumps(QWEN3, indent=1),
              "--calibration": yaml.safe_dump(SMALL_CALIBRATION)}[option]
    damaged_file = write(tmp, "config.json" if option == "--model" else "f.yaml", mutate(source, mutation, cut))
    args = ["simulate", str(damaged_file)] if option == "trace" else ["simulate", str(trace), option,
                                                                      str(damaged_file)]
    result = CliRunner().invoke(app, [*args, "--strategies", "paged"])
    assert result.exit_code in (0, 2), result.output
    if result.exit_code == 2:
        line, = result.output.strip().splitlines()
        assert line.startswith("error: "), line
