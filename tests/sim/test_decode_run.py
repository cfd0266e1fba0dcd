"""The compiled ``decode_run`` (``sim/request_loops.c``): a fresh bulk's clock, steps and profile from one pass over its
running requests, and the sums a bulk records, against the path a bulk takes without it (``decode_lengths``,
``decode_clock``, the cut at the stop, ``memory/bulk.py``'s NumPy profile, ``bulk_integrals``, ``category_slots``),
bit for bit; its refusals; and a replay that takes it, against one that does not."""

from __future__ import annotations

import math
import random
import types

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged_cli.memory.bulk import python_full_attention_profile
from minipaged_cli.sim import request_loops
from minipaged_cli.sim.bulk_advance import BulkAdvance, _spans
from minipaged_cli.sim.categories import category_slots
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.live_request import LiveRequest
from minipaged_cli.sim.replay import replay
from minipaged_cli.workloads.presets import load_gpu, load_model
from minipaged_cli.workloads.trace import Request, make_trace
from tests.sim.test_request_loops import PYTHON, broken, compiled


def decoding_requests(rng: random.Random) -> list[LiveRequest]:
    """A bulk's running requests: every prompt computed, each with tokens left to generate."""
    requests = []
    for index in range(rng.randint(1, 60)):
        prompt, output = rng.randint(1, 5000), rng.randint(2, 3000)
        generated = rng.randint(1, output - 1)
        requests.append(LiveRequest(index, prompt, output, num_computed=prompt + generated - 1,
                                    num_generated=generated, num_prefill_tokens=prompt))
    return requests


def reference(requests: list[LiveRequest], now: float, cap: int, terms: tuple, stop_s: float | None,
              block_size: int, num_free: int, allocated_sum: int) -> dict:
    """What a bulk computes from the same inputs without ``decode_run`` (``BulkAdvance._plan`` and ``advance``)."""
    lengths, finals, fewest, total = PYTHON.decode_lengths(requests)
    n, most = len(requests), min(fewest, cap)
    numbers, shortest = PYTHON.decode_clock(now, total + n, n, most, *terms)
    values = np.frombuffer(numbers)
    durations, clock = values[:most], values[most:]
    num_steps = most if stop_s is None else 1 + int(clock[1:-1].searchsorted(stop_s, side="left"))
    profile = python_full_attention_profile(block_size, num_free, np.frombuffer(lengths, dtype=np.int64),
                                            allocated_sum, np.frombuffer(finals, dtype=np.int64), num_steps)
    return {"durations": durations, "clock": clock, "shortest": shortest, "total": total, "profile": profile}


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_a_decode_run_is_the_bulks_own_path_to_the_bit(seed: int) -> None:
    rng = random.Random(seed)
    requests = decoding_requests(rng)
    block_size = rng.choice([1, 16, rng.randint(2, 64)])
    held = sum(-(-r.num_computed // block_size) * block_size for r in requests)
    allocated_sum = rng.choice([held, held + block_size * rng.randint(0, 50)])
    num_free = rng.choice([0, rng.randint(0, 40), rng.randint(0, 10**5)])
    tails = tuple(rng.uniform(0, 1e-3) for _ in range(rng.randint(0, 3)))
    terms = (rng.uniform(1e-4, 1e-2), rng.uniform(0, 1e-7), tails)
    if rng.random() < 0.03:  # a NaN in the model: the shortest step says so, and the bulk refuses it
        terms = (math.nan, *terms[1:])
    now, cap = rng.uniform(0, 1e4), rng.choice([1, rng.randint(1, 64), 4096])
    stop_s = rng.choice([None, now + rng.uniform(0, 2.0), now])
    run = compiled().decode_run(requests, now, cap, *terms, stop_s, block_size, num_free, allocated_sum)
    want = reference(requests, now, cap, terms, stop_s, block_size, num_free, allocated_sum)
    assert repr(run.shortest) == repr(want["shortest"])
    if math.isnan(want["shortest"]):
        return
    profile, clock, num_steps = want["profile"], want["clock"], run.num_steps
    assert (num_steps, run.total_length) == (profile.num_steps, want["total"])
    assert [run.time_at(j) for j in range(num_steps + 1)] == clock[:num_steps + 1].tolist()
    for _ in range(5):
        stop = rng.randint(0, num_steps)
        t = rng.choice([float(clock[rng.randint(0, num_steps)]), rng.uniform(now, float(clock[num_steps]) + 1)])
        assert run.step_at(t, stop) == 1 + int(clock[1:stop].searchsorted(t, side="left"))
        headroom = rng.choice([-1, 0, rng.randint(0, 10**4)])
        grown = profile.allocated[:stop] - allocated_sum
        assert run.steps_within(headroom, stop) == int(grown.searchsorted(headroom, side="right"))
        start = rng.randint(0, stop)
        first, external = rng.randint(0, start), rng.randint(0, 10**4)
        capacity, shared = rng.randint(10**4, 10**7), rng.choice([0, rng.randint(0, 10**4)])
        duration, weighted, allocated, internal, _ = PYTHON.bulk_integrals(
            want["durations"], start, stop, first, profile.allocated, profile.internal, None)
        tokens = (want["total"] + len(requests) * first) * duration + len(requests) * weighted  # (``_record``'s)
        slots = category_slots(tokens, allocated, internal, external * duration, capacity * duration,
                               shared * duration)
        assert run.record(start, stop, first, external, capacity, shared) == (duration, slots)


def test_a_decode_run_refuses_what_the_bulks_path_refuses() -> None:
    module = compiled()
    requests = [LiveRequest(1, 10, 5, num_computed=10, num_generated=1, num_prefill_tokens=10)]
    args = (0.0, 8, 0.01, 1e-6, (), None, 16, 100, 16)
    with pytest.raises(ValueError, match="no requests"):
        module.decode_run([], *args)
    for kind in ("unset", "not a request"):
        with pytest.raises(AttributeError):
            module.decode_run([*requests, broken(kind)], *args)
    with pytest.raises(ValueError, match="block size 0"):
        module.decode_run(requests, *args[:6], 0, *args[7:])
    with pytest.raises(ValueError, match="at most 8"):
        module.decode_run(requests, *args[:4], (0.0,) * 9, *args[5:])
    run = module.decode_run(requests, *args)
    assert run.num_steps == 4  # (its last step is the one its request finishes in)
    for call in (lambda: run.step_at(0.5, 5), lambda: run.time_at(-1), lambda: run.steps_within(0, 5),
                 lambda: run.record(3, 2, 0, 0, 100, 0), lambda: run.record(0, 5, 0, 0, 100, 0)):
        with pytest.raises(IndexError):
            call()
    assert PYTHON.decode_run(requests, *args) is None  # (without the compiled pass, a bulk takes its own path)


def test_a_replay_through_decode_runs_is_the_replay_without_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """A saturated replay (a queue behind a full pool, arrivals during bulks) with the compiled passes, each
    ``decode_run`` counted, against the same replay with the compiled passes but no ``decode_run``."""
    module = compiled()
    rng = random.Random(11)
    requests = [Request(f"r{i}", rng.uniform(0, 3.0), rng.randint(1, 1200), rng.randint(1, 300)) for i in range(120)]
    trace = make_trace("t", requests, source="test")
    config = SimConfig.of(load_model("qwen3-8b"), load_gpu("h200"), num_blocks=400, block_size=16,
                          max_model_len=4096)
    runs = []

    def counted(*args: object) -> object:
        run = module.decode_run(*args)
        runs.append(run.num_steps)
        return run

    results = {}
    for name, decode_run in (("without", lambda *args: None), ("with", counted)):
        passes = types.SimpleNamespace(**{name: getattr(module, name) for name in dir(module)
                                          if not name.startswith("_")})
        passes.decode_run = decode_run
        monkeypatch.setattr(request_loops, "loops", lambda passes=passes: passes)
        results[name] = replay(trace, config, "paged").to_dict()
    assert sum(1 for steps in runs if steps > 1) > 50  # (the compiled runs carried the bulks)
    assert results["with"]["num_preemptions"] > 0 and results["with"]["completed_requests"] == 120
    assert results["with"] == results["without"]


@settings(max_examples=300, deadline=None)
@given(data=st.data(), num_steps=st.integers(0, 12))
def test_a_bulks_spans_are_its_runs_of_steps_in_one_part_and_one_saturation(data: st.DataObject,
                                                                          num_steps: int) -> None:
    # The reference, step by step: each step's part (the last arrival at or before it) and whether it is held
    # back (at or past ``num_free``), consecutive equal ones one span
    starts = data.draw(st.sets(st.integers(1, max(num_steps - 1, 1)), max_size=3)) if num_steps > 1 else set()
    parts = [0, *sorted(starts)]
    num_free = data.draw(st.integers(0, num_steps))
    steps = [(max(i for i, start in enumerate(parts) if start <= j), j >= num_free) for j in range(num_steps)]
    expected, start = [], 0
    for j in range(1, num_steps + 1):
        if j == num_steps or steps[j] != steps[start]:
            expected.append((start, j, steps[start][0]))
            start = j
    assert list(_spans(parts, num_free, num_steps)) == expected


def test_a_decode_run_starts_from_the_heads_headroom_can_bulk_found(monkeypatch: pytest.MonkeyPatch) -> None:
    # The saturated replay above (a queue behind a full pool, arrivals during bulks), through the compiled passes
    # (MINIPAGED_NATIVE=0 or not): at each decode run with a queue, the headroom can_bulk kept is the one worked out
    # again now, and most runs had one
    module = compiled()
    monkeypatch.setattr(request_loops, "loops", lambda: module)
    rng = random.Random(11)
    requests = [Request(f"r{i}", rng.uniform(0, 3.0), rng.randint(1, 1200), rng.randint(1, 300)) for i in range(120)]
    trace = make_trace("t", requests, source="test")
    config = SimConfig.of(load_model("qwen3-8b"), load_gpu("h200"), num_blocks=400, block_size=16,
                          max_model_len=4096)
    kept, in_run = [], []
    advance_run, parts = BulkAdvance._advance_run, BulkAdvance._parts

    def running(self: BulkAdvance, run: object, through: bool) -> float | None:
        in_run.append(True)
        try:
            return advance_run(self, run, through)
        finally:
            in_run.pop()

    def checked(self: BulkAdvance, *args: object) -> tuple:
        answer = parts(self, *args)  # (arrivals during the run queued: the moment the run reads the headroom)
        if in_run and self.scheduler.waiting and self.scheduler.head_headroom is not None:
            kept.append(self.scheduler.head_headroom == self.scheduler.admission_headroom())
        return answer

    monkeypatch.setattr(BulkAdvance, "_advance_run", running)
    monkeypatch.setattr(BulkAdvance, "_parts", checked)
    result = replay(trace, config, "paged")
    assert result.completed_requests == 120 and len(kept) > 50 and all(kept)
