"""The benchmark tools' formats, each read from a small sample written in its documented format: the sessions,
turns, lengths and times they give, and, replayed, prefix-cache hits worked by hand (block size 16)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from minipaged_cli.errors import InputError
from minipaged_cli.workloads.readers import load_trace
from minipaged_cli.workloads.trace import Trace
from tests.conftest import ROOT
from tests.session_helpers import run

DATA = ROOT / "tests" / "data"


def by_id(trace: Trace) -> dict[str, object]:
    return {r.id: r for r in trace.requests}


def test_mooncake_rows_with_a_session_id_are_turns_sent_after_the_previous_answer() -> None:
    trace = load_trace(DATA / "mooncake_sessions.jsonl")
    assert [s.id for s in trace.sessions] == ["a", "b"]
    requests = by_id(trace)
    assert requests["a/1"].prefix == () and requests["a/1"].prompt_tokens == 1200  # its whole prompt, as written
    assert requests["mooncake-0"].arrival_s == 0.1 and requests["mooncake-0"].prefix == ("h9:300",)
    assert trace.turns["a/1"].delay_s == 0.5 and trace.sessions[1].start_s == 0.2
    _, clients = run(trace)
    position = {r.id: i for i, r in enumerate(trace.requests)}
    assert clients.sent_s[position["a/1"]] == pytest.approx(clients.finish_s[position["a/0"]] + 0.5)
    # a/1's blocks h1 and h2 are a/0's 1,024 prompt tokens (a/0's output is not in a Mooncake row's hash ids);
    # b (at 0.2 s) is h1 alone: a whole-prompt hit leaves its last block to compute (vLLM computes at least one
    # token), so 512 - 16.
    assert clients.cached_tokens[position["a/1"]] == 1024
    assert clients.cached_tokens[position["b/0"]] == 496


def test_aiperf_multi_turn_accumulates_the_conversation() -> None:
    trace = load_trace(DATA / "aiperf_multi_turn.jsonl")
    assert trace.sessions[0].start_s == 1.0 and trace.turns["chat-1/1"].delay_s == 2.0
    requests = by_id(trace)
    assert requests["chat-1/0"].prompt_tokens == 100  # 400 characters at 4 a token
    assert requests["chat-1/1"].prompt_tokens == 100 + 20 + 20
    assert requests["chat-2/0"].prompt_tokens == 100  # two 200-character texts
    _, clients = run(trace)
    position = {r.id: i for i, r in enumerate(trace.requests)}
    assert clients.cached_tokens[position["chat-1/1"]] == (100 + 20 - 1) // 16 * 16


def test_aiperf_single_turns_are_self_contained_and_sessions_only_order_them() -> None:
    trace = load_trace(DATA / "aiperf_single_turn.jsonl")
    requests = by_id(trace)
    assert (requests["aiperf-0"].prompt_tokens, requests["aiperf-1"].arrival_s) == (100, 0.25)
    assert requests["s/1"].prompt_tokens == 128 and requests["s/1"].runs == ((("in", "s/1"), 128),)
    assert trace.turns["s/1"].after == ("s/0",) and trace.sessions[0].start_s == 0.1


def test_sharegpt_conversations_pair_questions_with_their_answers() -> None:
    trace = load_trace(DATA / "sharegpt_conversations.json", "sharegpt")
    assert [s.id for s in trace.sessions] == ["c1", "c2"]  # c3 has no answer
    c1, c2 = trace.sessions
    assert [(t.input_tokens, t.output_tokens) for t in c1.turns] == [(100, 20), (10, 30)]
    assert [(t.input_tokens, t.output_tokens) for t in c2.turns] == [(10 + 20, 2)]  # system + human; no lead
    assert by_id(trace)["c1/1"].prompt_tokens == 100 + 20 + 10


def test_genai_perf_command_line_generates_its_sessions() -> None:
    trace = load_trace(DATA / "genai_perf_sessions.txt", "genai-perf")
    assert len(trace.sessions) == 3 and trace.num_requests == 6
    assert trace.segments == {"genai-perf-prefix-0": 64, "genai-perf-prefix-1": 64}
    for session in trace.sessions:
        assert [t.input_tokens for t in session.turns] == [164, 164]
        assert [t.output_tokens for t in session.turns] == [20, 20]
        assert [t.delay_s for t in session.turns] == [0.0, 1.0]
        assert all(len(t.segments) == 1 for t in session.turns)


def test_inference_perf_shared_prefix_groups_share_their_system_prompt() -> None:
    trace = load_trace(DATA / "inference_perf_shared_prefix.yml", "inference-perf")
    assert trace.num_requests == 12  # rate 6 for 2 s
    assert [r.arrival_s for r in trace.requests] == pytest.approx([i / 6 for i in range(12)])
    assert all(r.prompt_tokens == 150 and r.output_tokens == 20 for r in trace.requests)
    assert trace.segments == {"system-0": 100, "system-1": 100}
    metrics, _ = run(trace)
    # 96 tokens (6 blocks) of each group's system prompt are cached after its first request: 10 requests hit them.
    assert metrics.prefix_cache_hits >= 10 * 96


def test_inference_perf_multi_turn_chat_makes_each_prompt_a_user_session() -> None:
    trace = load_trace(DATA / "inference_perf_multi_turn.yml", "inference-perf")
    assert len(trace.sessions) == 6 and trace.num_requests == 12  # 6 users, 2 rounds each
    for session in trace.sessions:
        assert [t.input_tokens for t in session.turns] == [50, 50]
        assert session.turns[1].delay_s == pytest.approx(1.0)  # 6 users at 6 requests/s: a round a second
    second = next(r for r in trace.requests if r.id.endswith("/1"))
    assert second.prompt_tokens == 100 + 50 + 20 + 50


def test_vllm_multi_turn_config_counts_messages_and_prefixes_the_first() -> None:
    trace = load_trace(DATA / "vllm_multi_turn.json", "vllm-multi-turn")
    assert len(trace.sessions) == 3 and trace.segments == {"common-prefix": 50}
    for session in trace.sessions:  # 5 messages -> 6: three user turns
        assert [t.input_tokens for t in session.turns] == [190, 40, 40]
        assert [t.output_tokens for t in session.turns] == [30, 30, 30]
    _, clients = run(trace)
    position = {r.id: i for i, r in enumerate(trace.requests)}
    assert clients.cached_tokens[position["conv-0/1"]] == (190 + 30 - 1) // 16 * 16
    assert clients.cached_tokens[position["conv-1/0"]] == 48  # the common prefix's full blocks


def test_prefix_repetition_repeats_each_prefix_evenly() -> None:
    trace = load_trace(DATA / "prefix_repetition.yaml", "prefix-repetition")
    assert trace.num_requests == 9 and trace.segments == {f"prefix-{p}": 64 for p in range(3)}
    assert sorted(r.prefix[0] for r in trace.requests) == sorted(f"prefix-{p}" for p in range(3) for _ in range(3))
    metrics, _ = run(trace)
    assert (metrics.prefix_cache_queries, metrics.prefix_cache_hits) == (9 * 96, 6 * 64)


@pytest.mark.parametrize(("name", "fmt", "text", "message"), [
    ("a.jsonl", "auto", '{"turns": [{"text": "hi"}]}\n', "line 1 turns[0]: output_length: missing"),
    ("s.json", "sharegpt", '[{"conversations": [{"from": "robot", "value": "x"}]}]',
     "[0].conversations[0]: from: 'robot': expected one of"),
    ("g.txt", "genai-perf", "genai-perf profile --num-sessions 2", "output_tokens_mean: missing"),
    ("i.yml", "inference-perf", "data: {type: random}\n", "data: type: 'random': expected shared_prefix"),
    ("v.json", "vllm-multi-turn", '{"filetype": "generate_conversations", "num_conversations": 1, "prompt_input": '
     '{"num_turns": {"distribution": "pareto"}}, "prompt_output": {}}', "distribution: 'pareto': expected one of"),
    # sizes past what a trace holds are refused before anything that size is built
    ("g.txt", "genai-perf", 'genai-perf --num-sessions 2 --output-tokens-mean 3 --session-turns-mean 1e300',
     "session_turns_mean: '1e300': makes"),
    ("g.txt", "genai-perf", 'genai-perf --prompt "unclosed', "not a command line: No closing quotation"),
    ("i.yml", "inference-perf", "load: {stages: [{rate: 1e9, duration: 1e9}]}\ndata: {type: shared_prefix, "
     "shared_prefix: {system_prompt_len: 10, question_len: 5, output_len: 3}}", "load.stages[0]: rate: '1e9': makes"),
    ("v.json", "vllm-multi-turn", '{"filetype": "generate_conversations", "num_conversations": 1, "prompt_input": '
     '{"num_turns": {"distribution": "uniform", "min": 5, "max": 2}}, "prompt_output": {}}',
     "prompt_input.num_turns: max: 2: must be >= 5"),
])
def test_bad_files_name_the_place_the_field_and_the_value(tmp_path: Path, name: str, fmt: str, text: str,
                                                          message: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InputError) as error:
        load_trace(path, fmt)
    assert message in str(error.value)


SAMPLES = [("mooncake_sessions.jsonl", "auto"), ("aiperf_multi_turn.jsonl", "auto"),
           ("aiperf_single_turn.jsonl", "aiperf"), ("sharegpt_conversations.json", "sharegpt"),
           ("genai_perf_sessions.txt", "genai-perf"), ("inference_perf_multi_turn.yml", "inference-perf"),
           ("vllm_multi_turn.json", "vllm-multi-turn"), ("prefix_repetition.yaml", "prefix-repetition")]


@pytest.mark.parametrize(("name", "fmt"), SAMPLES)
def test_convert_writes_each_format_as_yaml_that_reads_back_the_same(tmp_path: Path, name: str, fmt: str) -> None:
    from typer.testing import CliRunner

    from minipaged_cli.cli.main import app

    out = tmp_path / "out.yaml"
    result = CliRunner().invoke(app, ["convert", str(DATA / name), str(out), "--format", fmt])
    assert result.exit_code == 0, result.output
    original, again = load_trace(DATA / name, fmt), load_trace(out)
    assert [replace(r, arrival_s=0) for r in again.requests] == [replace(r, arrival_s=0) for r in original.requests]
    assert [r.arrival_s for r in again.requests] == pytest.approx([r.arrival_s for r in original.requests], abs=1e-6)
    assert again.turns.keys() == original.turns.keys()
    assert all(again.turns[k].after == v.after and again.turns[k].delay_s == pytest.approx(v.delay_s, abs=1e-6)
               for k, v in original.turns.items())


@pytest.mark.parametrize(("name", "fmt"), [(name, fmt) for name, fmt in SAMPLES if fmt != "auto"])
def test_auto_tells_each_format_apart_and_a_converted_file_is_yaml(tmp_path: Path, name: str, fmt: str) -> None:
    from minipaged_cli.workloads.readers import detect_format
    from minipaged_cli.workloads.trace import dump_trace

    assert detect_format(DATA / name) == fmt
    converted = tmp_path / "converted.yaml"  # (its header names the source and the tool's options)
    converted.write_text(dump_trace(load_trace(DATA / name, fmt), header=f"from {name} --format {fmt} "
                                                                          "--num-sessions 3 prefix_repetition"))
    assert detect_format(converted) == "yaml"
