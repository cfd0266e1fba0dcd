"""The YAML trace's sessions: the ``sessions:`` list, the ``generate:`` form with ``turns``, ``convert``'s dump
read back unchanged, and bad sessions refused with one line (exit 2) naming the file, the place, the field and
the value."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from minipaged_cli.cli.main import app
from minipaged_cli.workloads.trace import dump_trace, load_yaml_trace

runner = CliRunner()

SESSIONS = """\
version: 1
segments: {sys: 32, doc: 64}
requests:
  - {id: plain, arrival_s: 0.5, prompt_tokens: 100, output_tokens: 10}
sessions:
  - id: chat
    start_s: 0.25
    prefix: [sys]
    turns:
      - {input_tokens: 100, output_tokens: 20}
      - {input_tokens: 30, output_tokens: 5, delay_s: 2.0}
      - {id: search, input_tokens: 10, output_tokens: 3, after: [1]}
      - {id: fetch, input_tokens: 12, output_tokens: 4, after: [1]}
      - {input_tokens: 70, output_tokens: 8, after: [search, fetch], segments: [doc], delay_s: 0.5}
generate:
  - count: 3
    seed: 2
    arrival: {process: constant, rate_per_s: 1}
    turns: {dist: constant, value: 4}
    delay_s: {dist: constant, value: 1.5}
    prompt_tokens: {dist: uniform, low: 10, high: 20}
    output_tokens: {dist: constant, value: 7}
    prefix: [sys]
"""


def write(tmp_path: Path, text: str, name: str = "t.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def test_sessions_and_generated_sessions_read_as_written(tmp_path: Path) -> None:
    trace = load_yaml_trace(write(tmp_path, SESSIONS))
    assert trace.num_requests == 1 + 5 + 3 * 4
    chat = trace.sessions[0]
    assert [chat.turn_id(i) for i in range(5)] == ["chat/0", "chat/1", "chat/search", "chat/fetch", "chat/4"]
    assert trace.turns["chat/4"].after == ("chat/search", "chat/fetch")
    assert trace.turns["chat/4"].delay_s == 0.5
    join = next(r for r in trace.requests if r.id == "chat/4")
    assert join.prompt_tokens == 32 + (100 + 20) + (30 + 5) + (10 + 3) + (12 + 4) + 70
    assert join.runs[-2:] == (("doc", 64), (("in", "chat/4"), 6))
    generated = [s for s in trace.sessions if s.id.startswith("gen0-")]
    assert [s.start_s for s in generated] == [0.0, 1.0, 2.0]  # a constant rate of 1/s
    assert all(t.output_tokens == 7 for s in generated for t in s.turns)
    assert [t.delay_s for t in generated[0].turns] == [0.0, 1.5, 1.5, 1.5]  # the first turn starts the session


def test_a_dump_reads_back_as_the_same_trace(tmp_path: Path) -> None:
    trace = load_yaml_trace(write(tmp_path, SESSIONS))
    again = load_yaml_trace(write(tmp_path, dump_trace(trace), "again.yaml"))
    assert again.requests == trace.requests
    assert again.turns == trace.turns
    limited = trace.limited(8)
    assert load_yaml_trace(write(tmp_path, dump_trace(limited), "limited.yaml")).requests == limited.requests


@pytest.mark.parametrize(("turns", "message"), [
    ("[{input_tokens: 10, output_tokens: 2, after: [1]}, {input_tokens: 5, output_tokens: 2}]",
     "t.yaml: sessions[0] (id s) turns[0]: after: [1]: a turn waits only for earlier turns of its session"),
    ("[{id: a, input_tokens: 10, output_tokens: 2, after: [a]}]", "turns[0]: after: ['a']: a turn waits only"),
    ("[{input_tokens: 10, output_tokens: 2}, {input_tokens: 5, output_tokens: 2, delay_s: -1}]",
     "turns[1]: delay_s: -1: must be >= 0"),
    ("[{input_tokens: 10, output_tokens: 2, think_s: 1}]", "turns[0]: think_s: unknown key"),
    ("[]", "sessions[0] (id s): turns: []: expected a list of one turn or more"),
])
def test_bad_sessions_exit_2_with_one_line(tmp_path: Path, turns: str, message: str) -> None:
    path = write(tmp_path, f"sessions:\n  - id: s\n    turns: {turns}\n")
    result = runner.invoke(app, ["simulate", str(path), "--strategies", "paged"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines


def test_bad_generated_sessions_name_the_group(tmp_path: Path) -> None:
    path = write(tmp_path, "generate:\n  - {count: 2, arrival: {process: poisson, rate_per_s: 1}, turns: {dist: "
                           "constant, value: 2}, delay_s: {dist: normal, mean: -1, std: 1}, prompt_tokens: {dist: "
                           "constant, value: 5}, output_tokens: {dist: constant, value: 5}}\n")
    result = runner.invoke(app, ["simulate", str(path), "--strategies", "paged"])
    assert result.exit_code == 2
    assert "generate[0].delay_s: mean: -1: must be >= 0" in result.stderr


def test_an_output_segment_must_hold_the_output(tmp_path: Path) -> None:
    path = write(tmp_path, "segments: {a-out: 7}\nrequests:\n  - {id: a, arrival_s: 0, prompt_tokens: 10, "
                           "output_tokens: 5, output_segment: a-out}\n")
    result = runner.invoke(app, ["simulate", str(path), "--strategies", "paged"])
    assert result.exit_code == 2
    assert "requests[0] (id a): output_segment: 'a-out': must name a segment of its 5 output tokens" in result.stderr
