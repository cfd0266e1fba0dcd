"""vLLM v0's scheduling worked by hand: unchunked, a step that admits prompts runs no decodes (v0's
``_schedule_default``: "Don't schedule decodes if prefills are scheduled"); chunked, v0 mixes them."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import StepWork, replay
from minipaged_cli.workloads.presets import GpuSpec, ModelSpec
from minipaged_cli.workloads.trace import Request, make_trace

# a (t=0, 100 prompt, 5 output) and b (t=0.015, 50 prompt, 3 output), every step 10 ms. By hand, unchunked:
#   step 1 [0.00, 0.01) a's prefill                  a's token 1 at 0.01
#   step 2 [0.01, 0.02) a decodes (b arrives at 0.015, after the step started)   a 2 at 0.02
#   step 3 [0.02, 0.03) b's prefill alone: a stalls   b 1 at 0.03
#   step 4 [0.03, 0.04) a, b decode                  a 3, b 2 at 0.04
#   step 5 [0.04, 0.05) a, b decode                  a 4, b 3 at 0.05: b done
#   step 6 [0.05, 0.06) a decodes                    a 5 at 0.06: a done
# TPOT (last - first token) / (output - 1): a (0.06 - 0.01) / 4 = 0.0125, b (0.05 - 0.03) / 2 = 0.01, mean 0.01125;
# e2e: a 0.06 - 0, b 0.05 - 0.015 = 0.035, mean 0.0475; makespan 0.06; 8 output tokens / 0.06 s = 133.3 tok/s.
# Mixing a's decode into step 3 (what v0 with chunked prefill does) ends a at 0.05: TPOT 0.01, e2e 0.0425, 160 tok/s.
TWO_REQUESTS = make_trace("t", [Request("a", 0.0, 100, 5), Request("b", 0.015, 50, 3)], source="test")


@pytest.fixture
def ten_ms_gpu(clock_gpu: GpuSpec) -> GpuSpec:
    """``clock_gpu`` with each step lasting 10 ms."""
    return dataclasses.replace(clock_gpu, step_overhead_s=0.01)


@pytest.mark.parametrize("bulk", [True, False])
def test_an_unchunked_v0_step_that_admits_a_prompt_runs_no_decode(tiny_model: ModelSpec, ten_ms_gpu: GpuSpec,
                                                                   bulk: bool) -> None:
    config = SimConfig.of(tiny_model, ten_ms_gpu, num_blocks=64, block_size=16, scheduler="v0", check_invariants=True)
    steps: list[StepWork] = []
    result = replay(TWO_REQUESTS, config, "paged", bulk=bulk, on_step=lambda work, _: steps.append(work))
    assert result.completed_requests == 2 and result.invariant_violations == 0
    assert result.mean_tpot_s == pytest.approx(0.01125)
    assert result.mean_e2e_s == pytest.approx(0.0475)
    assert result.makespan_s == pytest.approx(0.06)
    assert result.throughput_tokens_per_s == pytest.approx(8 / 0.06)
    if not bulk:  # (a data plane steps one at a time)
        assert [(len(w.prefills), len(w.decodes)) for w in steps] == [(1, 0), (0, 1), (1, 0), (0, 2), (0, 2),
                                                                      (0, 1)]


def test_chunked_v0_mixes_decodes_and_prefills(tiny_model: ModelSpec, ten_ms_gpu: GpuSpec) -> None:
    # --max-batched-tokens under v0 is its chunked prefill: a budget of 200 takes each prompt whole and a decodes
    # beside b's prefill in step 3, so a ends at 0.05 (the numbers after the trace above).
    config = SimConfig.of(tiny_model, ten_ms_gpu, num_blocks=64, block_size=16, scheduler="v0", max_batched_tokens=200)
    result = replay(TWO_REQUESTS, config, "paged", bulk=False)
    assert result.mean_tpot_s == pytest.approx(0.01)
    assert result.mean_e2e_s == pytest.approx(0.0425)
    assert result.makespan_s == pytest.approx(0.05)
    assert result.throughput_tokens_per_s == pytest.approx(160)


@settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(requests=st.lists(st.tuples(st.floats(0, 0.05), st.integers(1, 60), st.integers(1, 12), st.integers(1, 3)),
                         min_size=1, max_size=8),
       num_blocks=st.integers(8, 40), swap=st.booleans())
def test_no_unchunked_v0_step_mixes_prefills_and_decodes(tiny_model: ModelSpec, clock_gpu: GpuSpec,
                                                         requests: list[tuple[float, int, int, int]],
                                                         num_blocks: int, swap: bool) -> None:
    # Whatever arrives, preempts (by recompute or swap) or forks: a step prefills or decodes, never both.
    trace = make_trace("t", [Request(str(i), arrival, prompt, output, n=n)
                             for i, (arrival, prompt, output, n) in enumerate(requests)], source="test")
    config = SimConfig.of(tiny_model, clock_gpu, num_blocks=num_blocks, block_size=4, max_model_len=128,
                          scheduler="v0", preemption="swap" if swap else "recompute", cpu_blocks=8 if swap else 0,
                          check_invariants=True)
    steps: list[StepWork] = []
    result = replay(trace, config, "paged", bulk=False, on_step=lambda work, _: steps.append(work))
    assert result.invariant_violations == 0
    assert result.completed_requests + result.rejected_requests == len(requests)
    assert not [w for w in steps if w.prefills and w.decodes]
