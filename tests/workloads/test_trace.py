"""Trace formats: the YAML schema and its errors, seeded generators, and the importers of the public traces."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged_cli.errors import InputError
from minipaged_cli.workloads.readers import MOONCAKE_BLOCK_TOKENS, _mooncake_blocks, detect_format, load_trace
from minipaged_cli.workloads.trace import Request, dump_trace, load_yaml_trace
from tests.conftest import ROOT, shared_trace


def write(tmp_path: Path, text: str, name: str = "t.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_explicit_requests_are_read_and_sorted(tmp_path: Path) -> None:
    path = write(tmp_path, """
version: 1
name: two
segments: {sys: 100}
requests:
  - {id: late, arrival_s: 2.5, prompt_tokens: 300, output_tokens: 4, prefix: [sys]}
  - {id: 7, arrival_s: 0, prompt_tokens: 12.0, output_tokens: 1}
""")
    trace = load_yaml_trace(path)
    assert [r.id for r in trace.requests] == ["7", "late"]
    assert trace.requests[0].prompt_tokens == 12 and isinstance(trace.requests[0].prompt_tokens, int)
    assert trace.requests[1].prefix == ("sys",)
    assert (trace.prompt_tokens, trace.output_tokens) == (312, 5)


@pytest.mark.parametrize("name", ["mixed.yaml", "burst.yaml", "holes.yaml", "azure_conv_1k.yaml"])
def test_committed_traces_load(name: str) -> None:
    trace = load_trace(ROOT / "traces" / name)
    assert trace.num_requests > 0


def test_mixed_has_about_a_hundred_requests_of_three_shapes() -> None:
    trace = load_trace(ROOT / "traces" / "mixed.yaml")
    assert 90 <= trace.num_requests <= 110
    kinds = {r.id.split("-")[0] for r in trace.requests}
    assert kinds == {"chat", "doc", "completion"}


def test_generators_are_seeded_and_follow_their_distributions(tmp_path: Path) -> None:
    text = """
generate:
  - count: 4000
    seed: 11
    arrival: {process: poisson, rate_per_s: 8}
    prompt_tokens: {dist: lognormal, median: 600, sigma: 0.5, max: 100000}
    output_tokens: {dist: uniform, low: 10, high: 30}
"""
    first = load_yaml_trace(write(tmp_path, text))
    again = load_yaml_trace(write(tmp_path, text, "again.yaml"))
    assert first.requests == again.requests
    arrivals = np.array([r.arrival_s for r in first.requests])
    # Poisson process: mean gap 1 / rate = 0.125 s (4000 gaps: standard error 0.125 / sqrt(4000) ~ 0.002)
    assert np.diff(arrivals).mean() == pytest.approx(0.125, abs=0.01)
    prompts = np.array([r.prompt_tokens for r in first.requests])
    assert np.median(prompts) == pytest.approx(600, rel=0.05)
    assert np.log(prompts).std() == pytest.approx(0.5, rel=0.05)
    outputs = [r.output_tokens for r in first.requests]
    assert min(outputs) == 10 and max(outputs) == 30


def test_generator_bounds_clip(tmp_path: Path) -> None:
    trace = load_yaml_trace(write(tmp_path, """
generate:
  - count: 500
    arrival: {process: constant, rate_per_s: 2, start_s: 1}
    prompt_tokens: {dist: normal, mean: 100, std: 300, min: 50, max: 120}
    output_tokens: {dist: constant, value: 3}
"""))
    prompts = [r.prompt_tokens for r in trace.requests]
    assert min(prompts) == 50 and max(prompts) == 120
    assert [r.arrival_s for r in trace.requests[:3]] == [1.0, 1.5, 2.0]


BAD_TRACES = [
    ("requests: [unclosed", "not valid YAML", None),
    ("requests:\n  - {id: a, arrival_s: 0, prompt_tokens: 5, output_tokens: 2, promt: 3}", "did you mean 'prompt",
     "promt"),
    ("requests:\n  - {id: a, arrival_s: 0, output_tokens: 2}", "missing", "prompt_tokens"),
    ("requests:\n  - {id: a, arrival_s: 0, prompt_tokens: '12', output_tokens: 2}", "whole number", "prompt_tokens"),
    ("requests:\n  - {id: a, arrival_s: 0, prompt_tokens: -5, output_tokens: 2}", ">= 1", "-5"),
    ("requests:\n  - {id: a, arrival_s: 0, prompt_tokens: 12.5, output_tokens: 2}", "whole number", "12.5"),
    ("requests:\n  - {id: a, arrival_s: 0, prompt_tokens: 5, output_tokens: 0}", ">= 1", "output_tokens"),
    ("requests:\n  - {id: a, arrival_s: x, prompt_tokens: 5, output_tokens: 2}", "must be a finite number",
     "arrival_s"),
    ("requests:\n  - {id: a, arrival_s: 0, prompt_tokens: 5, output_tokens: 2}\n"
     "  - {id: a, arrival_s: 1, prompt_tokens: 5, output_tokens: 2}", "duplicate request id", "requests[1] (id a)"),
    ("requests: []", "no requests", None),
    ("requests:\n  - {id: a, arrival_s: 0, prompt_tokens: 5, output_tokens: 2, prefix: [sys]}", "unknown segment",
     "sys"),
    ("segments: {sys: 10}\nrequests:\n  - {id: a, arrival_s: 0, prompt_tokens: 5, output_tokens: 2, prefix: [sys]}",
     "more than the prompt", "prefix"),
    ("version: 2\nrequests: []", "only version 1", "version"),
    ("requests:\n  - {id: a, arrival_s: 0, prompt_tokens: 5, output_tokens: 2, n: 0}", "n: 0: must be >= 1", "(id a)"),
    ("requests:\n  - {id: a, arrival_s: 0, prompt_tokens: 5, output_tokens: 2, n: 1.5}", "must be a whole number",
     "n: 1.5"),
    ("reqests: []", "did you mean 'requests'", "reqests"),
    ("generate:\n  - {count: 3, arrival: {process: poison, rate_per_s: 1}, prompt_tokens: {dist: constant, value: 3},"
     " output_tokens: {dist: constant, value: 3}}", "did you mean 'poisson'", "generate[0].arrival"),
    ("generate:\n  - {count: 3, arrival: {process: poisson}, prompt_tokens: {dist: constant, value: 3},"
     " output_tokens: {dist: constant, value: 3}}", "missing", "rate_per_s"),
]


@pytest.mark.parametrize(("text", "message", "names"), BAD_TRACES)
def test_bad_yaml_is_one_line_naming_file_place_field_value(tmp_path: Path, text: str, message: str,
                                                             names: str | None) -> None:
    path = write(tmp_path, text)
    with pytest.raises(InputError) as caught:
        load_yaml_trace(path)
    line = str(caught.value)
    assert "\n" not in line
    assert line.startswith(str(path))
    assert message in line
    if names:
        assert names in line


def test_request_error_names_index_and_id(tmp_path: Path) -> None:
    path = write(tmp_path, "requests:\n  - {id: ok, arrival_s: 0, prompt_tokens: 5, output_tokens: 2}\n"
                           "  - {id: chat-3, arrival_s: 0, prompt_tokens: -5, output_tokens: 2}\n")
    with pytest.raises(InputError, match=r"requests\[1\] \(id chat-3\): prompt_tokens: -5: must be >= 1"):
        load_yaml_trace(path)


def test_parallel_samples_are_read_generated_and_written_back(tmp_path: Path) -> None:
    path = write(tmp_path, "requests:\n  - {id: a, arrival_s: 0, prompt_tokens: 5, output_tokens: 2, n: 4}\n"
                           "  - {id: b, arrival_s: 1, prompt_tokens: 5, output_tokens: 2}\n"
                           "generate:\n  - {count: 2, n: 3, arrival: {process: uniform, end_s: 1},\n"
                           "     prompt_tokens: {dist: constant, value: 3},\n"
                           "     output_tokens: {dist: constant, value: 3}}\n")
    trace = load_trace(path)
    assert sorted((r.id, r.n) for r in trace.requests) == [("a", 4), ("b", 1), ("gen0-0", 3), ("gen0-1", 3)]
    again = load_trace(write(tmp_path, dump_trace(trace), "again.yaml"))
    assert [(r.id, r.n) for r in again.requests] == [(r.id, r.n) for r in trace.requests]


def test_dump_and_load_round_trip(tmp_path: Path) -> None:
    trace = load_trace(ROOT / "traces" / "mixed.yaml")
    path = write(tmp_path, dump_trace(trace, header="a header"))
    again = load_trace(path)
    assert again.segments == trace.segments
    assert [(r.id, r.prompt_tokens, r.output_tokens, r.prefix) for r in again.requests] == \
        [(r.id, r.prompt_tokens, r.output_tokens, r.prefix) for r in trace.requests]
    assert path.read_text().startswith("# a header")


def test_limit_time_scale_and_rate(tmp_path: Path) -> None:
    # The 1k-request sample is parsed once; the options are the Trace methods load_trace applies after reading.
    full = load_trace(ROOT / "traces" / "azure_conv_1k.yaml")
    assert full.limited(10).requests == full.requests[:10]
    scaled = full.time_scaled(0.5)
    assert [r.arrival_s for r in scaled.requests] == [r.arrival_s * 0.5 for r in full.requests]
    retimed = full.with_poisson_arrivals(100.0, seed=3)
    assert np.diff([r.arrival_s for r in retimed.requests]).mean() == pytest.approx(0.01, rel=0.1)
    assert full.with_poisson_arrivals(100.0, seed=3) == retimed
    # load_trace applies them in that order: limit, rate, time scale (a small file, so that reading it is cheap).
    small = write(tmp_path, dump_trace(full.limited(20)))
    assert load_trace(small, limit=5, rate=100.0, seed=3, time_scale=0.5) == \
        load_yaml_trace(small).limited(5).with_poisson_arrivals(100.0, 3).time_scaled(0.5)


# -- importers -------------------------------------------------------------------------------------------

def test_azure_csv_with_seven_fractional_digits(tmp_path: Path) -> None:
    path = write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                           "2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:15:50.9951690,396,109\n", "a.csv")
    assert detect_format(path) == "azure"
    trace = load_trace(path)
    assert [r.prompt_tokens for r in trace.requests] == [374, 396]
    assert trace.requests[1].arrival_s == pytest.approx(4.314579, abs=1e-6)


def test_azure_arrivals_count_from_the_earliest_timestamp_whatever_the_row_order(tmp_path: Path) -> None:
    # Two requests 4 s apart, the later one written first: arrivals 0 s and 4 s, as when the rows are in order
    # (main counted from the first row: the earlier request arrived at -4 s and its TTFT included the 4 s).
    rows = ["2023-11-16 18:15:50.5000000,396,109\n", "2023-11-16 18:15:46.5000000,374,44\n"]
    swapped = load_trace(write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(rows), "s.csv"))
    assert [(r.prompt_tokens, r.arrival_s) for r in swapped.requests] == [(374, 0.0), (396, 4.0)]
    ordered = load_trace(write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n" + "".join(rows[::-1]), "o.csv"))
    assert [(r.prompt_tokens, r.output_tokens, r.arrival_s) for r in ordered.requests] == \
        [(r.prompt_tokens, r.output_tokens, r.arrival_s) for r in swapped.requests]


def test_azure_bad_row_names_line_and_column(tmp_path: Path) -> None:
    path = write(tmp_path, "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,374,-2\n", "a.csv")
    with pytest.raises(InputError, match=r"a.csv: line 2: GeneratedTokens: -2: must be >= 1"):
        load_trace(path)


def test_mooncake_hash_ids_become_512_token_segments(tmp_path: Path) -> None:
    path = write(tmp_path, '{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]}\n'
                           '{"timestamp": 3000, "input_length": 1024, "output_length": 2, "hash_ids": [0, 1]}\n',
                 "m.jsonl")
    trace = load_trace(path)
    first, second = trace.requests
    assert first.prefix == ("h0", "h1", "h2:76")  # the third block holds 1100 - 1024 = 76 tokens
    assert second.prefix == ("h0", "h1") and second.arrival_s == 3.0
    assert trace.segments == {"h0": 512, "h1": 512, "h2:76": 76}


@settings(max_examples=300, deadline=None)
@given(prompt=st.integers(0, 3000), hash_ids=st.lists(st.one_of(st.integers(0, 4), st.sampled_from(["2:100", True])),
                                                      max_size=8),
       earlier=st.dictionaries(st.sampled_from(["h0", "h1", "h2:100", "hTrue"]), st.integers(1, 512)))
def test_mooncake_blocks_are_named_as_a_walk_block_by_block_names_them(prompt: int, hash_ids: list[object],
                                                                       earlier: dict[str, int]) -> None:
    # Each 512-token block of the prompt in turn takes the next hash id (hash ids past the prompt name nothing):
    # the segments gain the names in that order, a later name's length replacing an earlier one's (a hash id
    # "2:100" names what id 2's 100-token last block does).
    segments, expected = dict(earlier), dict(earlier)
    names = []
    for block_id, start in zip(hash_ids, range(0, prompt, MOONCAKE_BLOCK_TOKENS), strict=False):
        tokens = min(MOONCAKE_BLOCK_TOKENS, prompt - start)
        name = f"h{block_id}" if tokens == MOONCAKE_BLOCK_TOKENS else f"h{block_id}:{tokens}"
        expected[name] = tokens
        names.append(name)
    assert _mooncake_blocks(prompt, hash_ids, segments, "m.jsonl", "line 1") == tuple(names)
    assert list(segments.items()) == list(expected.items())


def test_limit_keeps_only_the_segments_the_kept_requests_use(tmp_path: Path) -> None:
    path = write(tmp_path, '{"timestamp": 0, "input_length": 1100, "output_length": 5, "hash_ids": [0, 1, 2]}\n'
                           '{"timestamp": 9000, "input_length": 1600, "output_length": 2, "hash_ids": [0, 7, 8, 9]}\n'
                           '{"timestamp": 2000, "input_length": 600, "output_length": 2, "hash_ids": [5, 6]}\n',
                 "m.jsonl")
    assert load_trace(path).segments == {**{name: 512 for name in ("h0", "h1", "h5", "h7", "h8")},
                                         "h2:76": 76, "h6:88": 88, "h9:64": 64}
    two = load_trace(path, limit=2)  # the first two by arrival: t = 0 s and t = 2 s
    assert two.segments == {"h0": 512, "h1": 512, "h5": 512, "h2:76": 76, "h6:88": 88}
    again = load_trace(write(tmp_path, dump_trace(two), "two.yaml"))
    assert again.segments == two.segments and again.requests == two.requests


def test_lengths_csv_arrive_together_unless_rated(tmp_path: Path) -> None:
    path = write(tmp_path, "num_prefill_tokens,num_decode_tokens,num_total_tokens,pd_ratio\n74,918,992,0.08\n"
                           "290,905,1195,0.32\n", "l.csv")
    trace = load_trace(path)
    assert [(r.prompt_tokens, r.output_tokens, r.arrival_s) for r in trace.requests] == [(74, 918, 0.0),
                                                                                          (290, 905, 0.0)]
    assert load_trace(path, rate=1.0).requests[1].arrival_s > 0


def test_unknown_csv_header_asks_for_format(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="pass trace_format"):
        load_trace(write(tmp_path, "a,b\n1,2\n", "x.csv"))


# Published figures (../shared/traces/README.md): prompt and output means of each real trace.
PUBLISHED = [
    ("AzureLLMInferenceTrace_conv.csv", 19366, 1155, 211),
    ("AzureLLMInferenceTrace_code.csv", 8819, 2048, 27.9),
    ("mooncake_conversation_trace.jsonl", 12031, 12035, 343),
    ("mooncake_synthetic_trace.jsonl", 3993, 15325, 149),
    ("sharegpt_lengths_llama2_tokenizer.csv", 30731, 2340, 439),
]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "rows", "prompt_mean", "output_mean"), PUBLISHED)
def test_real_traces_match_published_statistics(name: str, rows: int, prompt_mean: float,
                                                output_mean: float) -> None:
    trace = load_trace(shared_trace(name))
    assert trace.num_requests == rows
    assert trace.prompt_tokens / rows == pytest.approx(prompt_mean, rel=0.001)
    assert trace.output_tokens / rows == pytest.approx(output_mean, rel=0.002)


@pytest.mark.slow
@pytest.mark.parametrize(("name", "ceiling"), [("mooncake_conversation_trace.jsonl", 0.374),
                                               ("mooncake_synthetic_trace.jsonl", 0.651)])
def test_mooncake_prefix_reuse_ceiling(name: str, ceiling: float) -> None:
    # With an unlimited cache, a prompt block is a hit when an earlier request already had it. The published
    # ceilings count 512-token blocks (full or not) of hash_ids, as our segments do.
    trace = load_trace(shared_trace(name))
    seen: set[str] = set()
    hits = 0
    for request in trace.requests:
        for segment in request.prefix:
            hits += trace.segments[segment] if segment in seen else 0
            seen.add(segment)
    share = hits / trace.prompt_tokens
    assert share <= ceiling + 0.001
    assert share == pytest.approx(ceiling, abs=0.02)


def test_azure_sample_is_the_head_of_the_real_trace() -> None:
    sample = load_trace(ROOT / "traces" / "azure_conv_1k.yaml")
    real = load_trace(shared_trace("AzureLLMInferenceTrace_conv.csv"), limit=1000)
    assert [(r.prompt_tokens, r.output_tokens) for r in sample.requests] == \
        [(r.prompt_tokens, r.output_tokens) for r in real.requests]
    assert all(math.isclose(a.arrival_s, b.arrival_s, abs_tol=1e-6) for a, b in zip(sample.requests, real.requests,
                                                                                    strict=True))


@settings(max_examples=100, deadline=None)
@given(fields=st.tuples(st.text(max_size=5), st.floats(0, 1e6), st.integers(1, 10**6), st.integers(1, 10**6),
                        st.lists(st.text(max_size=3), max_size=3).map(tuple), st.integers(1, 4),
                        st.lists(st.tuples(st.text(max_size=3), st.integers(1, 100)), max_size=3).map(tuple),
                        st.none() | st.text(max_size=3)),
       arrival_s=st.floats(0, 1e6))
def test_a_request_moved_in_time_is_the_one_dataclasses_replace_makes(fields: tuple, arrival_s: float) -> None:
    request = Request(*fields)
    moved = request.arriving_at(arrival_s)
    assert moved == dataclasses.replace(request, arrival_s=arrival_s) and type(moved) is Request
    assert hash(moved) == hash(dataclasses.replace(request, arrival_s=arrival_s))
    assert request == Request(*fields)  # (the original unchanged)
    with pytest.raises(dataclasses.FrozenInstanceError):
        moved.arrival_s = 0.0  # type: ignore[misc]


@settings(max_examples=100, deadline=None)
@given(fields=st.tuples(st.text(max_size=5), st.floats(0, 1e6), st.integers(1, 10**6), st.integers(1, 10**6),
                        st.lists(st.text(max_size=3), max_size=3).map(tuple)))
def test_a_plain_request_is_the_one_its_dataclass_init_makes(fields: tuple) -> None:
    # Every field: one added to Request with a default that ``plain`` does not set shows here
    plain, made = Request.plain(*fields), Request(*fields)
    assert vars(plain) == vars(made) and plain == made and hash(plain) == hash(made) and type(plain) is Request
    with pytest.raises(dataclasses.FrozenInstanceError):
        plain.prompt_tokens = 1  # type: ignore[misc]
