"""A step's passes over its running requests: the decodes' lengths moved on, the lengths summed, and what a bulk
advance reads of each (``sim/replay.py``, ``sim/bulk_advance.py``); and a bulk's step times and clock. Here in
Python, the reference, and compiled from ``request_loops.c`` (CPython's C API) where this machine can build it, as
``memory/pool_loops.py`` builds the pool's loops: the same functions, arguments and results (the clock's floats
bit for bit). ``MINIPAGED_NATIVE=0`` keeps these.

Every step and every bulk passes over all its running requests (a hundred on a loaded engine), though nothing but
two counts changes for most; in Python the bytecodes of those passes cost a replay of the Azure trace a tenth of its
time, and a bulk of a few steps spends more on NumPy's calls than on their arithmetic.
``tests/sim/test_request_loops.py`` drives both on random requests and compares every figure.

One pass is compiled only: ``decode_run``, a fresh bulk's lengths, clock, steps and allocation profile over one
full-attention pool at once (``DecodeRun``), and the sums it records; here it answers None, and the bulk takes its
own path through the passes above and NumPy, which ``tests/sim/test_decode_run.py`` compares it with.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Protocol

import numpy as np

from minipaged_cli import native_build
from minipaged_cli.sim.live_request import LiveRequest


def advance(requests: Sequence[LiveRequest], num_steps: int) -> None:
    """Each request computes and generates ``num_steps`` more tokens (decode steps)."""
    for request in requests:
        request.num_computed += num_steps
        request.num_generated += num_steps


def computed_total(requests: Sequence[LiveRequest]) -> int:
    """Σ of the requests' computed tokens."""
    return sum([request.num_computed for request in requests])  # (a list: a generator costs a resume per item)


def decode_lengths(requests: Sequence[LiveRequest]) -> tuple[bytes, bytes, int, int]:
    """The requests' computed and final lengths (each as int64s, the bytes of a NumPy array: ``np.frombuffer``
    reads them without a conversion per item), the fewest tokens any has left to generate (some must run), and the
    computed lengths' sum."""
    if not requests:
        raise ValueError("decode_lengths: no requests")
    computed = [request.num_computed for request in requests]
    return (np.array(computed, dtype=np.int64).tobytes(),
            np.array([request.final_length for request in requests], dtype=np.int64).tobytes(),
            min([request.output_tokens - request.num_generated for request in requests]), sum(computed))


def finished(requests: Sequence[LiveRequest]) -> list[LiveRequest]:
    """The requests that have generated all their tokens, in order."""
    return [request for request in requests if request.num_generated >= request.output_tokens]


def decode_run_end(requests: Sequence[LiveRequest], start: int, stop: int) -> int:
    """The first index from ``start`` on, before ``stop`` (and the list's end), whose request does not decode (its
    prompt not all computed, or tokens loading); where every one does, that bound (``start`` where it is past it)."""
    if start < 0:
        raise ValueError(f"decode_run_end: start {start} < 0")
    end, stop = start, min(stop, len(requests))
    while end < stop:
        request = requests[end]
        if request.loading_tokens or request.num_computed < request.num_prefill_tokens:
            break
        end += 1
    return end


def all_prefilled(requests: Sequence[LiveRequest]) -> bool:
    """Whether every request has its prompt computed."""
    for request in requests:  # noqa: SIM110 - a loop: ``all`` over a generator resumes it per request
        if request.num_computed < request.num_prefill_tokens:
            return False
    return True


def decode_clock(now: float, first_context: int, step_context: int, num_steps: int, head: float, per_token: float,
                 tails: tuple[float, ...]) -> tuple[bytes, float]:
    """A run of ``num_steps`` decode steps from ``now`` whose step j (from 0) reads ``first_context + j *
    step_context`` tokens of K/V and lasts ``head + context * per_token`` plus each of ``tails`` in turn
    (``StepTimeModel.decode_step_terms``): the steps' times, then the clock at each step boundary (``now``, then each
    step's end, added one step at a time), as 2 * num_steps + 1 float64s; and the shortest step's time (NaN where
    one is NaN, infinity where there is none)."""
    contexts = np.arange(first_context, first_context + step_context * num_steps, step_context, dtype=np.int64)
    durations = head + contexts * per_token
    for tail in tails:
        durations = durations + tail
    shortest = float(np.minimum.reduce(durations)) if num_steps else math.inf
    return np.concatenate((durations, step_clock(now, durations))).tobytes(), shortest


class BulkClock(Protocol):
    """A bulk's clock (a ``DecodeRun``, or ``BulkPlan``'s arrays)."""

    def step_at(self, t: float, stop: int) -> int:
        """The first of steps 1 to ``stop`` that starts at or after ``t`` (``stop`` where none before it does)."""

    def time_at(self, step: int) -> float:
        """The clock at step ``step``'s start (0 to the run's steps)."""


class DecodeRun(BulkClock, Protocol):
    """The compiled ``decode_run``'s answer: a fresh bulk of decode steps over one full-attention pool. ``num_steps``:
    its steps (cut before the one that starts at or after the stop, then at the first whose new blocks the free ones
    do not cover); ``total_length``: Σ the running requests' lengths at its start; ``shortest``: its clock's shortest
    step (NaN where one is NaN)."""

    num_steps: int
    total_length: int
    shortest: float

    def steps_within(self, headroom: int, stop: int) -> int:
        """Of the first ``stop`` steps, how many take at most ``headroom`` slots more than the start held."""

    def record(self, start: int, stop: int, first: int, external: int, capacity: int,
               shared: int) -> tuple[float, tuple[float, ...]]:
        """Steps ``start`` to ``stop``: their time and ``category_slots``' integrals over them (``first``: the step
        the part they are in starts at; ``external``, ``capacity``, ``shared``: slots), as ``BulkAdvance._record``
        works them out."""


def decode_run(requests: Sequence[LiveRequest], now: float, cap: int, head: float, per_token: float,
               tails: tuple[float, ...], stop_s: float | None, block_size: int, num_free: int,
               allocated_sum: int) -> None:
    """None: the compiled ``decode_run`` (a bulk's steps from one pass, ``sim/bulk_advance.py``'s plain case) has no
    Python twin here; its reference is the bulk's own path, ``decode_lengths``, ``decode_clock``, the pool's
    ``full_attention_profile`` and ``bulk_integrals``, which ``tests/sim/test_request_loops.py`` compares it with."""
    return None


def bulk_integrals(durations: np.ndarray, start: int, stop: int, first: int, allocated: np.ndarray | int,
                   internal: np.ndarray | int, tokens: np.ndarray | None) -> tuple[float, float, float, float,
                                                                                   float | None]:
    """Steps ``start`` to ``stop`` of a bulk whose steps last ``durations`` (``BulkAdvance._record``): their time
    Σ d_j, the weight Σ d_j * (j - first + 1) of the tokens each step adds since step ``first``, and Σ d_j * s_j of
    each ``BulkProfile`` series s (per step, an int64 array; or one number: it times the time; ``tokens`` None:
    None). Each sum runs in step order, a product and an addition at a time (the compiled one's floats bit for
    bit)."""
    if durations.dtype != np.float64 or durations.ndim != 1:
        raise TypeError("bulk_integrals: the durations must be float64s")
    if not 0 <= start <= stop <= len(durations):
        raise IndexError(f"bulk_integrals: steps {start} to {stop} of {len(durations)}")
    part = durations[start:stop].tolist()
    duration = weighted = 0.0
    for weight, seconds in enumerate(part, start=start - first + 1):
        duration += seconds
        weighted += seconds * weight
    return (duration, weighted, _series_integral(allocated, part, duration, start),
            _series_integral(internal, part, duration, start),
            None if tokens is None else _series_integral(tokens, part, duration, start))


def _series_integral(values: np.ndarray | int, part: list[float], duration: float, start: int) -> float:
    """Σ d_j * values[j] over the steps from ``start`` lasting ``part``; a number (a NumPy scalar or an array of no
    dimension too) times ``duration``."""
    if not isinstance(values, np.ndarray) or values.ndim == 0:
        return float(values) * duration
    if values.dtype != np.int64 or values.ndim != 1 or start + len(part) > len(values):
        raise ValueError(f"bulk_integrals: a series must be int64 covering steps {start} to {start + len(part)}")
    total = 0.0
    for value, seconds in zip(values[start:start + len(part)].tolist(), part, strict=True):
        total += float(value) * seconds
    return total


def step_clock(now: float, durations: np.ndarray) -> np.ndarray:
    """The clock at each boundary of the steps lasting ``durations`` from ``now`` (``now``, then each step's end),
    added one step at a time as the single-step path adds them (``np.add.accumulate`` adds in order; ``now`` plus
    a ``cumsum`` of the durations alone rounds otherwise).

    [k] durations -> [k + 1] times"""
    return np.add.accumulate(np.concatenate(([now], durations)))


@cache
def _compiled() -> ModuleType | RuntimeError:
    """The compiled module, bound to ``LiveRequest``'s slots, or why it could not be built (asked once a process)."""
    module = native_build.built("_request_loops", Path(__file__).with_suffix(".c"))
    if not isinstance(module, RuntimeError):
        module.bind_live_request(LiveRequest)
    return module


def loops() -> ModuleType:
    """The compiled passes where they build (unless ``MINIPAGED_NATIVE=0``), else this module's."""
    return native_build.chosen(_compiled, "sim/request_loops.c") or sys.modules[__name__]
