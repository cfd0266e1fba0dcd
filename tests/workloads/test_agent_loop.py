"""The agent-loop generator (a ``generate:`` group with ``steps``): a task's calls chain, a step that fans out
joins all its calls in the next one, and the replay sends a join only after every branch has answered."""

from __future__ import annotations

from pathlib import Path

from minipaged_cli.workloads.trace import load_yaml_trace
from tests.session_helpers import run

AGENTS = """\
segments: {system: 300, tools: 700}
generate:
  - count: 4
    seed: 1
    arrival: {process: poisson, rate_per_s: 2}
    prefix: [system, tools]
    prompt_tokens: {dist: constant, value: 200}
    steps: {dist: constant, value: 4}
    parallel: {dist: uniform, low: 1, high: 3}
    output_tokens: {dist: constant, value: 30}
    tool_result_tokens: {dist: constant, value: 100}
    tool_latency_s: {dist: constant, value: 0.25}
"""


def test_agent_tasks_fan_out_and_join(tmp_path: Path) -> None:
    path = tmp_path / "agents.yaml"
    path.write_text(AGENTS)
    trace = load_yaml_trace(path)
    assert len(trace.sessions) == 4 and all(s.prefix == ("system", "tools") for s in trace.sessions)
    joins = 0
    for session in trace.sessions:
        turns = session.turns
        assert turns[0].input_tokens == 200 and turns[0].after is None
        main = [t for t in turns if sum(u.after == t.after for u in turns) == 1]  # (branches share theirs)
        assert len(main) == 4  # four calls on the main path, whatever fans out between them
        for i, turn in enumerate(turns):
            if turn.after is not None and len(turn.after) > 1:  # a join: no latency of its own, after its branches
                joins += 1
                assert turn.delay_s == 0.0 and all(turns[b].after == turns[turn.after[0]].after for b in turn.after)
            elif i:
                assert turn.delay_s == 0.25
    assert joins > 0  # (seed 1 fans out somewhere)
    metrics, clients = run(trace)
    position = {r.id: i for i, r in enumerate(trace.requests)}
    for request_id, link in trace.turns.items():
        if len(link.after) > 1:
            assert clients.sent_s[position[request_id]] == max(clients.finish_s[position[a]] for a in link.after)
    assert metrics.sessions.hit_pct_later_turns > metrics.sessions.hit_pct_first_turn > 0
