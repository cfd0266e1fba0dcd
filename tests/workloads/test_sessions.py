"""Sessions in the trace model, worked by hand: a turn's prefix-cache hit is the full blocks of its history the
earlier turn computed, floor((P + O - 1) / 16) * 16, what an eviction leaves of them, and a session replays exactly as
the flat requests it sends would at the times it sends them."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from minipaged_cli.errors import InputError
from minipaged_cli.sim.accounting import StrategyMetrics
from minipaged_cli.workloads.sessions import Session, Turn
from minipaged_cli.workloads.trace import Request, Trace, make_trace
from tests.session_helpers import run


def two_turns(prompt: int, output: int) -> Trace:
    return make_trace("t", [], source="test", sessions=[Session("s", (Turn(prompt, output),
                                                                     Turn(50, 10, delay_s=1.0)))])


@pytest.mark.parametrize(("output", "hit"), [(40, 1024), (41, 1040)])
def test_second_turn_hits_the_first_turns_prompt_and_output_blocks(output: int, hit: int) -> None:
    # Turn 0 computes P + O - 1 tokens (the last sampled one is never fed back), so its full blocks hold
    # floor((1000 + O - 1) / 16) * 16 tokens: 1024 for O = 40, 1040 for O = 41. Turn 1's prompt starts with those
    # P + O tokens and finds them all.
    metrics, clients = run(two_turns(1000, output))
    assert clients.cached_tokens == [0, hit]
    # Turn 0: one prefill step then O - 1 decodes of 1 ms; turn 1 is sent 1 s after that answer.
    assert clients.finish_s[0] == pytest.approx(output * 0.001)
    assert clients.sent_s[1] == pytest.approx(clients.finish_s[0] + 1.0)
    sessions = metrics.sessions
    assert sessions.hit_pct_first_turn == 0.0
    assert sessions.hit_pct_later_turns == pytest.approx(100 * hit / (1000 + output + 50))
    assert sessions.mean_session_s == pytest.approx(clients.finish_s[1])
    assert (sessions.completed_sessions, sessions.turns_completed) == (1, 2)


def test_an_eviction_between_turns_leaves_the_history_s_first_blocks() -> None:
    # 8 blocks of 16. Turn 0 (64 + 17 tokens) computes 80 tokens: 5 full blocks, cached when it finishes, freed
    # last block first (vLLM frees a request's blocks in reverse, so its tail is evicted first). C (80 + 1 tokens,
    # 5 blocks) arrives in the think time: 3 never-used blocks, then the 2 cached blocks at the free queue's
    # front, turn 0's blocks 4 and 3. Turn 1 (64 + 17 + 20 = 101 prompt tokens) finds blocks 0-2: 48 tokens.
    trace = make_trace("t", [Request("c", 0.1, 80, 1)], source="test",
                       sessions=[Session("s", (Turn(64, 17), Turn(20, 1, delay_s=1.0)))])
    metrics, clients = run(trace, num_blocks=8)
    assert [r.id for r in trace.requests] == ["s/0", "c", "s/1"]
    assert clients.cached_tokens == [0, 0, 48]
    # evicted: C's 2 from turn 0, then turn 1's 4 new blocks from C's 5 cached ones
    assert metrics.num_evictions == 6


def flat(trace: Trace, sent_s: list[float]) -> Trace:
    """The session's turns as plain requests arriving when the session sent them (blocks named as before)."""
    requests = sorted((replace(r, arrival_s=t) for r, t in zip(trace.requests, sent_s, strict=True)),
                      key=lambda r: r.arrival_s)
    return Trace(trace.name, tuple(requests), trace.segments)


def without_sessions(metrics: StrategyMetrics) -> dict[str, object]:
    return metrics.measurements()


def generated(count: int = 12, seed: int = 5) -> Trace:
    from minipaged_cli.workloads.session_yaml import generate_sessions

    group = {"count": count, "seed": seed, "arrival": {"process": "poisson", "rate_per_s": 40},
             "turns": {"dist": "uniform", "low": 1, "high": 5}, "delay_s": {"dist": "uniform", "low": 0, "high": 0.05},
             "prompt_tokens": {"dist": "uniform", "low": 5, "high": 300},
             "output_tokens": {"dist": "uniform", "low": 1, "high": 60}, "prefix": ["sys"]}
    return make_trace("g", [Request("x", 0.01, 500, 30, ("sys",))], source="test", segments={"sys": 40},
                      sessions=generate_sessions(group, 0, "test"))


@pytest.mark.parametrize("bulk", [True, False])
def test_a_session_replays_as_its_turns_sent_at_those_times(bulk: bool) -> None:
    # Under memory pressure (preemptions) and overlapping sessions: the same steps, hits and latencies.
    trace = generated()
    metrics, clients = run(trace, num_blocks=60, bulk=bulk)
    assert metrics.num_preemptions > 0 and metrics.prefix_cache_hits > 0
    reference, _ = run(flat(trace, clients.sent_s), num_blocks=60, bulk=bulk)
    assert without_sessions(metrics) == without_sessions(reference)


def test_fan_out_and_fan_in_build_the_history_in_session_order() -> None:
    session = Session("a", (Turn(100, 20), Turn(30, 5, after=(0,), name="x"), Turn(40, 6, after=(0,), name="y"),
                            Turn(10, 8, after=(1, 2))), prefix=("sys",))
    trace = make_trace("t", [], source="test", segments={"sys": 16}, sessions=[session])
    join = next(r for r in trace.requests if r.id == "a/3")
    assert join.prompt_tokens == 16 + 100 + 20 + 30 + 5 + 40 + 6 + 10
    assert [label for label, _ in join.runs] == [("in", "a/0"), ("out", "a/0"), ("in", "a/x"), ("out", "a/x"),
                                                 ("in", "a/y"), ("out", "a/y"), ("in", "a/3")]
    assert trace.turns["a/3"].after == ("a/x", "a/y")
    _, clients = run(trace)
    position = {r.id: i for i, r in enumerate(trace.requests)}
    finish = {name: clients.finish_s[i] for name, i in position.items()}
    assert clients.sent_s[position["a/3"]] == max(finish["a/x"], finish["a/y"])
    # Both branches find turn 0's 135 tokens' full blocks (8 of 16); the join finds x's history and output.
    assert clients.cached_tokens[position["a/x"]] == 128
    assert clients.cached_tokens[position["a/3"]] == (16 + 100 + 20 + 30 + 5 - 1) // 16 * 16


def test_a_history_longer_than_max_model_len_rejects_the_turn_and_ends_the_session() -> None:
    trace = make_trace("t", [], source="test", sessions=[Session("s", (Turn(300, 50), Turn(300, 50, delay_s=0.1),
                                                                       Turn(10, 5, delay_s=0.1)))])
    metrics, _ = run(trace, max_model_len=600)
    assert metrics.completed_requests == 1 and metrics.rejected_requests == 1
    assert metrics.rejection_reasons == {"longer than --max-model-len": 1}
    sessions = metrics.sessions
    assert (sessions.turns_completed, sessions.turns_rejected, sessions.turns_not_sent) == (1, 1, 1)
    assert sessions.completed_sessions == 0


@pytest.mark.parametrize(("turns", "message"), [
    ((Turn(10, 2), Turn(10, 2, after=(1,))), "sessions[0] (id s) turns[1]: after: [1]: a turn waits only for "
                                             "earlier turns"),
    ((Turn(10, 2, after=(3,)),), "after: [3]"),
    ((Turn(10, 2, segments=("doc",)),), "segments: 'doc': unknown segment"),
])
def test_bad_sessions_name_the_turn_the_field_and_the_value(turns: tuple[Turn, ...], message: str) -> None:
    with pytest.raises(InputError) as error:
        make_trace("t", [], source="f.yaml", sessions=[Session("s", turns)])
    assert message in str(error.value)


def test_limit_keeps_a_turn_only_with_what_it_waits_for() -> None:
    trace = generated()
    for limit in (1, 5, 17):
        limited = trace.limited(limit)
        assert limited.num_requests <= limit
        kept = {r.id for r in limited.requests}
        assert all(set(link.after) <= kept for link in limited.turns.values())
        # the ids stay: a limited trace's turns are the first turns of the same sessions
        assert all(trace.turns[r.id].after == limited.turns[r.id].after for r in limited.requests
                   if r.id in limited.turns)


def test_time_scale_and_rate_re_time_session_starts_not_think_times() -> None:
    trace = generated()
    scaled = trace.time_scaled(0.5)
    starts = {s.id: s.start_s for s in trace.sessions}
    assert all(s.start_s == pytest.approx(starts[s.id] * 0.5) for s in scaled.sessions)
    assert [t.delay_s for s in scaled.sessions for t in s.turns] == [t.delay_s for s in trace.sessions
                                                                      for t in s.turns]
    retimed = trace.with_poisson_arrivals(2.0, seed=1)
    assert retimed.num_requests == trace.num_requests
    assert sorted(s.start_s for s in retimed.sessions) != sorted(starts.values())


def written_flat(trace: Trace, sent_s: list[float]) -> str:
    """The session trace as plain YAML requests at their send times, each turn's history spelled out as shared
    segments: every earlier input and output a segment (``output_segment`` names a turn's output)."""
    from minipaged_cli.workloads.trace import dump_trace

    segments = dict(trace.segments)
    requests = []
    for request, sent in zip(trace.requests, sent_s, strict=True):
        names = []
        for label, length in request.runs:
            name = label if isinstance(label, str) else ":".join(label)
            segments[name] = length
            names.append(name)
        segments[f"out:{request.id}"] = request.output_tokens
        requests.append(Request(request.id, sent, request.prompt_tokens, request.output_tokens,
                                (*request.prefix, *names), output_segment=f"out:{request.id}"))
    return dump_trace(make_trace(trace.name, requests, source="test", segments=segments))


def test_a_session_trace_written_as_flat_requests_with_explicit_segments_replays_the_same(tmp_path: Path) -> None:
    from minipaged_cli.workloads.trace import load_yaml_trace

    trace = generated()
    metrics, clients = run(trace, num_blocks=60)
    path = tmp_path / "flat.yaml"
    path.write_text(written_flat(trace, clients.sent_s))
    flat = load_yaml_trace(path)
    assert not flat.sessions and all(r.output_segment for r in flat.requests)
    reference, flat_clients = run(flat, num_blocks=60)
    assert metrics.prefix_cache_hits > 0 and metrics.num_preemptions > 0
    # The same decisions (counts exact); times within the YAML's rounding of arrivals to the microsecond.
    ours, theirs = without_sessions(metrics), without_sessions(reference)
    times = [k for k, v in ours.items() if isinstance(v, float)]
    assert {k: v for k, v in ours.items() if k not in times} == {k: v for k, v in theirs.items() if k not in times}
    assert [ours[k] for k in times] == pytest.approx([theirs[k] for k in times], rel=1e-4, abs=1e-6)
    cached = dict(zip((r.id for r in trace.requests), clients.cached_tokens, strict=True))
    assert dict(zip((r.id for r in flat.requests), flat_clients.cached_tokens, strict=True)) == cached
