"""A step's compiled passes over its running requests (``sim/request_loops.c``) against their Python reference
(``sim/request_loops.py``): on random requests (counts past CPython's cached small ints, the same request listed
twice) the same results and the same counts after; on a broken request (an unset count, one that is not an int, an
object that is not a request) the same error, the requests before it moved as the Python loop leaves them; and a
whole replay the same under either."""

from __future__ import annotations

import copy
import dataclasses
import math
import random
import sys
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged_cli.sim import request_loops
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.live_request import LiveRequest
from minipaged_cli.sim.replay import replay
from minipaged_cli.sim.request_loops import step_clock
from minipaged_cli.sim.step_time import StepTimeModel
from minipaged_cli.workloads.presets import load_gpu, load_model
from minipaged_cli.workloads.trace import Request, make_trace
from tests.memory.conftest import usable
from tests.sim.test_step_time import _synthetic_calibration as synthetic_calibration

PYTHON = sys.modules[request_loops.__name__]


def compiled():
    return usable(request_loops._compiled())


def random_requests(rng: random.Random) -> list[LiveRequest]:
    requests = []
    for index in range(rng.randint(1, 40)):
        prompt, output = rng.randint(1, 5000), rng.randint(1, 3000)
        # (mid-prefill, loading, finished ones among the decodes, as a step's running requests may be)
        prefill = rng.choice([prompt, rng.randint(1, prompt + output)])
        requests.append(LiveRequest(index, prompt, output,
                                    num_computed=rng.choice([rng.randint(0, prompt + output), prefill, prefill - 1]),
                                    num_generated=rng.choice([rng.randint(0, output), output, output - 1]),
                                    num_prefill_tokens=prefill,
                                    loading_tokens=rng.choice([0, 0, 0, rng.randint(1, 300)])))
    if rng.random() < 0.2:  # one request listed twice: moved twice, as the Python loop moves it
        requests.append(rng.choice(requests))
    return requests


def counts(requests: list[LiveRequest]) -> list[tuple[int, ...]]:
    return [(r.num_computed, r.num_generated, r.output_tokens, r.final_length) for r in requests]


@settings(max_examples=200, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), num_steps=st.integers(0, 5000))
def test_the_compiled_passes_match_the_python_ones(seed: int, num_steps: int) -> None:
    module = compiled()
    python_requests = random_requests(random.Random(seed))
    compiled_requests = copy.deepcopy(python_requests)  # (a request listed twice stays one object)
    lengths, finals, fewest_left, total = PYTHON.decode_lengths(python_requests)
    assert module.decode_lengths(compiled_requests) == (lengths, finals, fewest_left, total)
    assert total == sum(r.num_computed for r in python_requests)
    assert np.frombuffer(lengths, dtype=np.int64).tolist() == [r.num_computed for r in python_requests]
    assert np.frombuffer(finals, dtype=np.int64).tolist() == [r.final_length for r in python_requests]
    assert fewest_left == min(r.output_tokens - r.num_generated for r in python_requests)
    assert module.computed_total(compiled_requests) == PYTHON.computed_total(python_requests)
    assert [r.sequence_id for r in module.finished(compiled_requests)] == \
        [r.sequence_id for r in PYTHON.finished(python_requests)]
    assert module.all_prefilled(compiled_requests) is PYTHON.all_prefilled(python_requests)
    assert module.all_prefilled(compiled_requests[:1]) is PYTHON.all_prefilled(python_requests[:1])
    rng = random.Random(seed + 1)
    for _ in range(5):
        start, stop = rng.randint(0, len(python_requests) + 2), rng.randint(0, len(python_requests) + 2)
        assert module.decode_run_end(compiled_requests, start, stop) == \
            PYTHON.decode_run_end(python_requests, start, stop)
    module.advance(compiled_requests, num_steps)
    PYTHON.advance(python_requests, num_steps)
    assert counts(compiled_requests) == counts(python_requests)
    assert module.computed_total(tuple(compiled_requests)) == PYTHON.computed_total(python_requests)
    assert module.computed_total([]) == PYTHON.computed_total([]) == 0


def broken(kind: str) -> object:
    if kind == "not a request":
        return object()
    request = LiveRequest(7, 10, 5, num_computed=3)
    del request.num_computed, request.num_generated  # (every pass reads one of them)
    return request


@pytest.mark.parametrize("kind", ["unset", "not a request"])
def test_a_broken_request_raises_as_python_does(kind: str) -> None:
    module = compiled()
    for passes in (PYTHON, module):
        requests = [LiveRequest(1, 10, 5, num_computed=4, num_generated=1), broken(kind)]
        with pytest.raises(AttributeError):
            passes.advance(requests, 3)
        moved = (requests[0].num_computed, requests[0].num_generated)
        # (an unset count: the request before it moved, as the Python loop leaves it; another class: the compiled
        # passes check every item's class before they move any)
        assert moved == ((4, 1) if kind == "not a request" and passes is module else (7, 4))
        with pytest.raises(AttributeError):
            passes.decode_lengths(requests)
        for call in (passes.finished, passes.all_prefilled):
            with pytest.raises(AttributeError):
                call(requests)
        with pytest.raises(AttributeError):
            passes.decode_run_end(requests, 0, 2)
        with pytest.raises(ValueError, match="no requests"):
            passes.decode_lengths([])
        with pytest.raises(ValueError, match="start -1 < 0"):
            passes.decode_run_end(requests, -1, 2)


def test_the_compiled_passes_take_int_counts_only() -> None:
    request = LiveRequest(1, 10, 5, num_computed=4, num_generated=1)
    request.num_computed = 4.5
    with pytest.raises(TypeError, match="not an int"):
        compiled().computed_total([request])


def test_a_replay_makes_the_same_decisions_and_figures_under_either(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled()
    rng = random.Random(5)
    requests = [Request(f"r{i}", rng.uniform(0, 2.0), rng.randint(1, 1500), rng.randint(1, 400)) for i in range(60)]
    trace = make_trace("t", requests, source="test")
    config = SimConfig.of(load_model("qwen3-8b"), load_gpu("h200"), num_blocks=300, block_size=16,
                          max_model_len=4096)
    results = {}
    for name, passes in (("python", PYTHON), ("compiled", compiled())):
        monkeypatch.setattr(request_loops, "loops", lambda passes=passes: passes)
        results[name] = replay(trace, config, "paged").to_dict()
    assert results["python"]["num_preemptions"] > 0 and results["python"]["completed_requests"] == 60
    assert results["python"] == results["compiled"]


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_the_compiled_clock_is_numpys_to_the_bit(seed: int) -> None:
    rng = random.Random(seed)
    tails = tuple(rng.choice([0.0, -0.0, rng.uniform(0, 1e-3), rng.uniform(-1e-3, 1e-3)])
                  for _ in range(rng.randint(0, 4)))
    args = (rng.uniform(0, 1e5), rng.randint(0, 10**9), rng.randint(1, 10**4), rng.choice([0, 1, rng.randint(2, 300)]),
            rng.uniform(-1e-3, 1e-2), rng.choice([rng.uniform(0, 1e-6), rng.uniform(-1e-9, 1e-9)]), tails)
    if rng.random() < 0.05:  # a NaN in the model: the shortest step is NaN on both
        args = (*args[:4], math.nan, *args[5:])
    compiled_numbers, compiled_shortest = compiled().decode_clock(*args)
    numbers, shortest = PYTHON.decode_clock(*args)
    assert compiled_numbers == numbers
    assert repr(compiled_shortest) == repr(shortest)  # (NaN and the infinity of no step included)


def random_series(rng: random.Random, num_steps: int) -> np.ndarray | int:
    """A ``BulkProfile`` series: one count a step (slots up to a large pool's), or one count for all."""
    if rng.random() < 0.3:
        return rng.randint(0, 10**9)
    return np.array([rng.randint(0, 10**9) for _ in range(num_steps)], dtype=np.int64)


@settings(max_examples=300, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_a_bulks_integrals_are_the_sums_of_its_steps(seed: int) -> None:
    """``bulk_integrals``: compiled and Python agree to the bit (NaN and infinities included), and both are the
    sums worked step by step in exact rational arithmetic, to a float's rounding."""
    rng = random.Random(seed)
    num_steps = rng.choice([1, 2, rng.randint(3, 10), rng.randint(11, 4096)])
    cut = rng.choice([0, rng.randint(1, 50)])  # (a plan cut short reads its later steps: a view into its array)
    durations = np.array([rng.choice([rng.uniform(1e-3, 0.2), rng.uniform(0, 1e-6)])
                          for _ in range(cut + num_steps)])[cut:]
    if rng.random() < 0.03:
        durations[rng.randrange(num_steps)] = rng.choice([math.nan, math.inf])
    start = rng.randint(0, num_steps)
    stop, first = rng.randint(start, num_steps), rng.randint(0, start)
    allocated, internal = random_series(rng, num_steps), random_series(rng, num_steps)
    tokens = rng.choice([None, random_series(rng, num_steps)])
    args = (durations, start, stop, first, allocated, internal, tokens)
    got = compiled().bulk_integrals(*args)
    assert repr(got) == repr(PYTHON.bulk_integrals(*args))
    if not np.isfinite(durations[start:stop]).all():
        return
    part = [Fraction(float(d)) for d in durations[start:stop]]

    def exact(values: np.ndarray | int | None) -> float | None:
        if values is None:
            return None
        per_step = [values] * len(part) if isinstance(values, int) else values[start:stop].tolist()
        return float(sum(d * v for d, v in zip(part, per_step, strict=True)))

    expected = (float(sum(part)), float(sum(d * (start + j - first + 1) for j, d in enumerate(part))),
                exact(allocated), exact(internal), exact(tokens))
    for value, want in zip(got, expected, strict=True):
        if want is None:
            assert value is None
        else:
            assert value == pytest.approx(want, rel=1e-12, abs=1e-300)


def test_bulk_integrals_refuse_misshapen_input_and_read_a_scalar_as_every_steps() -> None:
    durations = np.full(4, 0.01)
    for passes in (PYTHON, compiled()):
        with pytest.raises(IndexError):
            passes.bulk_integrals(durations, 0, 5, 0, 0, 0, None)
        for series in (np.zeros(4), np.zeros(3, dtype=np.int64)):  # (floats; too few steps)
            with pytest.raises(ValueError):
                passes.bulk_integrals(durations, 0, 4, 0, series, 0, None)
        with pytest.raises(TypeError):
            passes.bulk_integrals(durations.astype(np.float32), 0, 4, 0, 0, 0, None)
        # (a NumPy scalar, or an array of no dimension, is one number for every step)
        duration, _, allocated, internal, _ = passes.bulk_integrals(durations, 0, 4, 0, np.int64(3), np.array(5), None)
        assert (allocated, internal) == (3 * duration, 5 * duration)


MODELS = [("qwen3-8b", "h200"), ("llama-2-7b", "h100"), ("llama-3.1-70b", "h200"), ("gemma-3-27b", "h200"),
          ("gpt-oss-20b", "h200")]


@pytest.mark.parametrize(("model", "gpu"), MODELS)
@pytest.mark.parametrize("calibration", [None, "without decode table", "with decode table"])
def test_a_bulks_clock_from_the_models_terms_is_step_seconds_to_the_bit(model: str, gpu: str,
                                                                       calibration: str | None) -> None:
    """``StepTimeModel.decode_step_terms`` adds a decode step up as ``step_seconds`` does: the clock both passes
    build from it is the model's own arrays and ``step_clock``, bit for bit; and it is None exactly where a step's
    time is no line in its context (a sliding window's share, a calibration's decode table)."""
    spec = load_model(model)
    table = None if calibration is None else synthetic_calibration(spec)
    if calibration == "without decode table":
        table = dataclasses.replace(table, decode_attention=None)
    step_time = StepTimeModel(spec, load_gpu(gpu), table)
    rng = random.Random(f"{model} {calibration}")
    for _ in range(20):
        n, total, num_steps, now = rng.randint(1, 300), rng.randint(0, 10**6), rng.randint(1, 200), rng.uniform(0, 1e4)
        terms = step_time.decode_step_terms(n)
        assert (terms is None) == (bool(spec.num_sliding_layers) or calibration == "with decode table")
        if terms is None:
            continue
        contexts = np.arange(total + n, total + n * (num_steps + 1), n, dtype=np.int64)
        durations = step_time.step_seconds(new_tokens=n, sequences=n, decodes=n, decode_context=contexts)
        expected = np.concatenate((durations, step_clock(now, durations))).tobytes()
        for passes in (PYTHON, compiled()):
            numbers, shortest = passes.decode_clock(now, total + n, n, num_steps, *terms)
            assert numbers == expected and shortest == float(durations.min())
