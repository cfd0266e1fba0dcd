"""The simulator: small traces worked by hand, the fast path against step-by-step replay, termination, and the
vLLM paper's Fig. 2 picture on real request lengths."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from minipaged_cli.errors import InputError
from minipaged_cli.memory.allocators import Holding
from minipaged_cli.memory.strategies import STRATEGIES, make_allocator
from minipaged_cli.sim.admission import AdmissionPolicy
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import Replay, replay, simulate
from minipaged_cli.workloads.presets import GpuSpec, ModelSpec, load_gpu, load_model
from minipaged_cli.workloads.readers import load_trace
from minipaged_cli.workloads.trace import Request, make_trace
from tests.conftest import ROOT, shared_trace
from tests.sim.test_replay_sharing import ComputedContent

CATEGORY_KEYS = ("token_state_pct", "reserved_future_pct", "internal_frag_pct", "external_frag_pct", "free_pct")


def trace_of(*requests: tuple[float, int, int]):
    return make_trace("t", [Request(f"r{i}", a, p, o) for i, (a, p, o) in enumerate(requests)], source="test")


def test_one_request_by_hand(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    # prompt 10, output 5, block 4, 40 slots; every step lasts 1 ms.
    # step 1 prefills 10 tokens (3 blocks = 12 slots); steps 2-5 decode: L = 11, 12, 13, 14 (final = 10 + 5 - 1).
    # paged A = 12, 12, 12, 16, 16 -> tokens 60/5 = 12 (30 %), reserved min(A,14)-L = 2,1,0,1,0 (2 %),
    # internal max(A-14, 0) = 0,0,0,2,2 (2 %), usage 68/5 = 13.6 (34 %).
    config = SimConfig.of(tiny_model, clock_gpu, num_blocks=10, block_size=4, max_model_len=20)
    trace = trace_of((0.0, 10, 5))
    paged = replay(trace, config, "paged")
    assert paged.averaged_over == "busy"
    assert paged.token_state_pct == pytest.approx(30.0)
    assert paged.reserved_future_pct == pytest.approx(2.0)
    assert paged.internal_frag_pct == pytest.approx(2.0)
    assert paged.free_pct == pytest.approx(66.0)
    assert paged.kv_cache_usage_perc == pytest.approx(34.0)
    assert paged.mean_ttft_s == pytest.approx(0.001)
    assert paged.makespan_s == pytest.approx(0.005)
    assert paged.mean_tpot_s == pytest.approx(0.001)
    assert paged.throughput_tokens_per_s == pytest.approx(1000.0)
    # oracle: extent 15 -> reserved 14 - L = 4,3,2,1,0 (5 %), internal 1 (2.5 %)
    oracle = replay(trace, config, "oracle-reserve")
    assert (oracle.reserved_future_pct, oracle.internal_frag_pct) == pytest.approx((5.0, 2.5))
    # max-reserve: extent 20 -> internal 6 (15 %); pow2 and dynamic: extent 16 -> internal 2 (5 %)
    assert replay(trace, config, "max-reserve").internal_frag_pct == pytest.approx(15.0)
    assert replay(trace, config, "pow2-reserve").internal_frag_pct == pytest.approx(5.0)
    assert replay(trace, config, "dynamic").internal_frag_pct == pytest.approx(5.0)


def test_external_fragmentation_by_hand(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    # oracle-reserve on 40 slots. At t=0: A (10+5 -> extent 15 at [0,15)), B (9+1 -> 10 at [15,25)),
    # C (10+5 -> 15 at [25,40)). B finishes with step 1 and leaves the hole [15,25). D (11+1 -> needs 12)
    # arrives at 1.5 ms and waits through steps 3-5, when A and C hold L = 12, 13, 14 each:
    # tokens 26 (65 %), reserved 14-L summed = 2 (5 %), internal 1+1 (5 %), external: the 10-slot hole (25 %).
    config = SimConfig.of(tiny_model, clock_gpu, num_blocks=40, block_size=1, max_model_len=40)
    trace = trace_of((0.0, 10, 5), (0.0, 9, 1), (0.0, 10, 5), (0.0015, 11, 1))
    oracle = replay(trace, config, "oracle-reserve")
    assert oracle.averaged_over == "saturated"
    assert [getattr(oracle, k) for k in CATEGORY_KEYS] == pytest.approx([65.0, 5.0, 5.0, 25.0, 0.0])
    assert oracle.mean_ttft_s == pytest.approx((0.001 + 0.001 + 0.001 + (0.006 - 0.0015)) / 4)
    # paged needs no contiguous hole: D is admitted at the first step after it arrives (step 3)
    paged = replay(trace, config, "paged")
    assert paged.external_frag_pct == 0.0 and paged.averaged_over == "busy"
    assert paged.mean_ttft_s == pytest.approx((0.001 + 0.001 + 0.001 + (0.003 - 0.0015)) / 4)


def test_recompute_preemption_of_the_latest_admitted(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    # 4 blocks of 2: A (prompt 2) and B (prompt 2) start with one block each; each decode crosses into a new
    # block every two tokens, so the pool runs dry and B, admitted last, is preempted and recomputed.
    config = SimConfig.of(tiny_model, clock_gpu, num_blocks=4, block_size=2, max_model_len=16)
    result = replay(trace_of((0.0, 2, 6), (0.0, 2, 6)), config, "paged", bulk=False)
    assert result.num_preemptions >= 1
    assert result.completed_requests == 2 and result.rejected_requests == 0


def test_requests_that_can_never_fit_are_rejected_and_the_replay_ends(tiny_model: ModelSpec,
                                                                      clock_gpu: GpuSpec) -> None:
    config = SimConfig.of(tiny_model, clock_gpu, num_blocks=8, block_size=2, max_model_len=64)
    # 40 tokens > the 16-slot pool; 70 tokens > max_model_len; the others fit
    trace = trace_of((0.0, 4, 3), (0.0, 30, 10), (0.1, 60, 10), (0.2, 5, 5))
    for strategy in ("paged", "oracle-reserve", "dynamic"):
        result = replay(trace, config, strategy)
        assert (result.completed_requests, result.rejected_requests) == (2, 2), strategy


def test_capacity_too_small_for_any_request_is_bad_input(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    config = SimConfig.of(tiny_model, clock_gpu, num_blocks=2, block_size=2, max_model_len=64)
    with pytest.raises(InputError, match="too small for any request under paged"):
        simulate(trace_of((0.0, 30, 10)), config, ("paged",))
    with pytest.raises(InputError, match="max_model_len"):
        simulate(trace_of((0.0, 60, 10)), config, ("paged",))
    with pytest.raises(InputError, match="did you mean 'paged'"):
        simulate(trace_of((0.0, 1, 1)), config, ("pagd",))


def unrounded(metrics) -> dict:
    # to_dict rounds to 6 decimals; the two paths sum in different orders, and a value exactly on a rounding
    # boundary (37.3046875) may then round apart: compare the numbers themselves.
    return metrics.measurements()


def assert_same_replay(fast: dict, slow: dict, label: str) -> None:
    """The event-driven replay's measurements (``fast``) equal stepping one decode step at a time (``slow``), and
    are sane: categories summing to 100 %, no invariant broken. Pops the keys it compares exactly."""
    assert fast.pop("averaged_over") == slow.pop("averaged_over"), label
    assert fast.pop("rejection_reasons") == slow.pop("rejection_reasons"), label
    # None (no completed request: no latency) must match exactly; pytest.approx takes numbers only.
    assert [k for k, v in fast.items() if v is None] == [k for k, v in slow.items() if v is None], label
    assert {k: v for k, v in fast.items() if v is not None} == pytest.approx(
        {k: v for k, v in slow.items() if v is not None}, rel=1e-9, abs=1e-9), label
    assert sum(fast[k] for k in CATEGORY_KEYS) == pytest.approx(100.0, abs=0.01)
    assert min(fast[k] for k in CATEGORY_KEYS) >= -1e-9
    assert fast["invariant_violations"] == 0


SEGMENTS = {"sys": 100, "doc": 37}  # 37: blocks straddle the segment boundary for every block size but 1


def random_requests(rng: np.random.Generator, count: int, sharing: bool, *, own_tokens: int,
                    output_tokens: int) -> list[Request]:
    """``count`` requests arriving over 1.5 s, each with fewer than ``own_tokens`` prompt tokens of its own and
    ``output_tokens`` to generate; with ``sharing``, shared prefixes of ``SEGMENTS`` and parallel samples."""
    requests = []
    for i in range(count):
        prefix = tuple(rng.choice(["sys", "doc"], size=int(rng.integers(0, 3)))) if sharing else ()
        prompt = sum(SEGMENTS[s] for s in prefix) + int(rng.integers(1, own_tokens))
        n = int(rng.choice([1, 1, 2, 3])) if sharing else 1
        requests.append(Request(f"r{i}", float(rng.uniform(0, 1.5)), prompt, int(rng.integers(1, output_tokens)),
                                prefix, n))
    return requests


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@example(seed=0, block_size=1, chunk=None, num_blocks=32, sharing=False, swap=False, watermark=0.0, scheduler="v0",
         max_num_seqs=256, long_prefill=0)
@example(seed=356, block_size=1, chunk=None, num_blocks=32, sharing=False, swap=False, watermark=0.0, scheduler="v0",
         max_num_seqs=256, long_prefill=0)
@example(seed=3225, block_size=1, chunk=None, num_blocks=30, sharing=False, swap=False, watermark=0.0,
         scheduler="v0", max_num_seqs=256, long_prefill=0)
@example(seed=7, block_size=4, chunk=64, num_blocks=30, sharing=True, swap=False, watermark=0.0, scheduler="v0",
         max_num_seqs=256, long_prefill=0)
@example(seed=11, block_size=16, chunk=64, num_blocks=30, sharing=True, swap=True, watermark=0.0, scheduler="v0",
         max_num_seqs=256, long_prefill=0)
@example(seed=7, block_size=4, chunk=64, num_blocks=30, sharing=True, swap=False, watermark=0.05, scheduler="v1",
         max_num_seqs=1, long_prefill=0)
@example(seed=11, block_size=16, chunk=None, num_blocks=30, sharing=True, swap=False, watermark=0.0, scheduler="v1",
         max_num_seqs=2, long_prefill=48)
@given(seed=st.integers(0, 10_000), block_size=st.sampled_from([1, 4, 16]),
       chunk=st.sampled_from([None, 64]), num_blocks=st.integers(30, 120), sharing=st.booleans(),
       swap=st.booleans(), watermark=st.sampled_from([0.0, 0.05]), scheduler=st.sampled_from(["v1", "v0"]),
       max_num_seqs=st.sampled_from([1, 2, 256]), long_prefill=st.sampled_from([0, 48]))
def test_fast_path_equals_step_by_step(seed: int, block_size: int, chunk: int | None, num_blocks: int,
                                       sharing: bool, swap: bool, watermark: float, scheduler: str,
                                       max_num_seqs: int, long_prefill: int) -> None:
    # The event-driven replay must give exactly what stepping one decode step at a time gives, under every
    # SimConfig knob it can reach: both schedulers, a max_num_seqs that binds (1, 2), v1's long-prefill threshold;
    # with sharing: shared prefixes, prefix caching and parallel samples; with swap (v0 only): swap preemption to a
    # small CPU pool. Chunked prefill, prefix caching and preemption together: no step may read a cached block no
    # step computed. (seed 0: dynamic, a request preempts itself, then runs alone; seed 356: pow2, 37.3046875 %
    # sits on a 6-decimal rounding boundary; seed 3225: nothing runs and the head's recompute prompt no longer
    # fits.)
    rng = np.random.default_rng(seed)
    requests = random_requests(rng, int(rng.integers(3, 30)), sharing, own_tokens=300, output_tokens=150)
    swap = swap and scheduler == "v0"
    config = SimConfig.of(load_model("qwen3-8b"), load_gpu("h200"), num_blocks=num_blocks * 16 // block_size,
                          block_size=block_size, max_model_len=1024, max_batched_tokens=chunk, check_invariants=True,
                          prefix_caching=sharing, preemption="swap" if swap else "recompute",
                          cpu_blocks=8 * 16 // block_size, watermark=watermark, scheduler=scheduler,
                          max_num_seqs=max_num_seqs,
                          long_prefill_token_threshold=long_prefill if scheduler == "v1" else 0)
    trace = make_trace("t", requests, source="test", segments=SEGMENTS)
    for strategy in STRATEGIES:
        fast = unrounded(replay(trace, config, strategy))
        # every request ends, completed or rejected; those that can never run are rejected as such
        allocator = make_allocator(strategy, num_blocks=config.cache.num_blocks, block_size=block_size,
                                   max_model_len=1024)
        admission = AdmissionPolicy.for_engine(scheduler, config.watermark_blocks)
        never = sum(r.total_tokens > 1024 or admission.rejection_reason(
            allocator, Holding(0, r.prompt_tokens, r.output_tokens)) is not None for r in trace.requests)
        assert fast["completed_requests"] + fast["rejected_requests"] == len(requests), strategy
        assert sum(fast["rejection_reasons"].values()) == fast["rejected_requests"]
        # the rest were rejected at run time: preempted, their recompute prompt no longer fit
        at_arrival = {k: v for k, v in fast["rejection_reasons"].items() if not k.startswith("preempted")}
        assert sum(at_arrival.values()) == never, strategy
        assert_same_replay(fast, unrounded(replay(trace, config, strategy, bulk=False)), strategy)
        if strategy == "paged" and sharing and not swap:  # (a swap-in restores K/V outside the StepWork)
            replay(trace, config, strategy, on_step=ComputedContent(block_size))
        assert fast["prefix_cache_hits"] <= fast["prefix_cache_queries"]


@settings(max_examples=20, deadline=None)
@example(seed=0, num_blocks=30, window=2, threshold=0.0)
@given(seed=st.integers(0, 10_000), num_blocks=st.integers(30, 120), window=st.sampled_from([2, 8]),
       threshold=st.sampled_from([0.0, 0.5]))
def test_fast_path_with_cache_aware_admission(seed: int, num_blocks: int, window: int, threshold: float) -> None:
    # vLLM 0.34.0's cache-aware admission reorders the waiting queue at every step while the cache is full enough:
    # a request other than the head may come first and be admitted, and the head, the saturation and the external
    # fragmentation follow the new order. The event-driven replay must give what stepping one step at a time gives.
    # (seed 0 under window 2: the bulk advance once ignored the reorder and parted from the single steps.)
    rng = np.random.default_rng(seed)
    requests = random_requests(rng, int(rng.integers(3, 30)), True, own_tokens=300, output_tokens=150)
    config = SimConfig.of(load_model("qwen3-8b"), load_gpu("h200"), num_blocks=num_blocks, block_size=16,
                          max_model_len=1024, max_batched_tokens=64, prefix_caching=True, check_invariants=True,
                          cache_aware_admission_window=window, cache_aware_admission_threshold=threshold)
    trace = make_trace("t", requests, source="test", segments=SEGMENTS)
    assert_same_replay(unrounded(replay(trace, config, "paged")),
                       unrounded(replay(trace, config, "paged", bulk=False)), f"window {window}")


@pytest.mark.slow
def test_mixed_trace_orders_the_strategies() -> None:
    config = SimConfig.of(load_model("qwen3-8b"), load_gpu("h200"), num_blocks=46_844, block_size=16,
                          check_invariants=True)
    result = simulate(load_trace(ROOT / "traces" / "mixed.yaml"), config)
    token = {name: m.token_state_pct for name, m in result.strategies.items()}
    assert token["max-reserve"] < token["pow2-reserve"] < token["oracle-reserve"] < token["paged"]
    assert all(m.invariant_violations == 0 and m.completed_requests == 100 for m in result.strategies.values())
    document = result.to_dict()
    assert set(document) == {"trace", "config", "strategies"}
    for metrics in document["strategies"].values():
        assert sum(metrics[k] for k in CATEGORY_KEYS) == pytest.approx(100.0, abs=0.01)


@pytest.mark.slow
def test_sharegpt_reproduces_the_vllm_paper_fig2_picture() -> None:
    # vLLM paper Fig. 2 (OPT-13B, ShareGPT): token states 20.4 % (Orca Max), 26.8 % (Pow2), 38.2 % (Oracle),
    # 96.3 % (vLLM). The acceptance: the same order, paged >= 90 %, max-reserve <= 40 %, on real
    # ShareGPT lengths with arrivals fast enough to keep the memory full. In v0's scheduling, the paper's (it
    # predates v1): whole prompts reserved at admission, the 1 % watermark, no prefix caching.
    trace = load_trace(shared_trace("sharegpt_lengths_llama2_tokenizer.csv"), rate=20.0, limit=1500)
    config = SimConfig.of(load_model("qwen3-8b"), load_gpu("h200"), num_blocks=7281, block_size=16,
                          max_model_len=8192, scheduler="v0")
    result = simulate(trace, config)
    token = {name: m.token_state_pct for name, m in result.strategies.items()}
    assert token["max-reserve"] < token["pow2-reserve"] < token["oracle-reserve"] < token["paged"]
    assert token["paged"] >= 90.0 and token["max-reserve"] <= 40.0
    assert all(m.averaged_over == "saturated" for m in result.strategies.values())


@pytest.mark.slow
def test_committed_azure_sample_shows_the_same_picture() -> None:
    # The same acceptance on the committed slice of a real trace, so it runs wherever the tests run, in both
    # engines' scheduling (v1 allocates chunk by chunk: the order and the bounds hold there too).
    trace = load_trace(ROOT / "traces" / "azure_conv_1k.yaml", rate=40.0)
    for scheduler in ("v0", "v1"):
        config = SimConfig.of(load_model("qwen3-8b"), load_gpu("h200"), num_blocks=7281, block_size=16,
                              max_model_len=8192, scheduler=scheduler)
        token = {name: m.token_state_pct for name, m in simulate(trace, config).strategies.items()}
        assert token["max-reserve"] < token["pow2-reserve"] < token["oracle-reserve"] < token["paged"], scheduler
        assert token["paged"] >= 90.0 and token["max-reserve"] <= 40.0, scheduler

    token = {name: m.token_state_pct for name, m in simulate(trace, config).strategies.items()}
    assert token["max-reserve"] < token["pow2-reserve"] < token["oracle-reserve"] < token["paged"]
    assert token["paged"] >= 90.0 and token["max-reserve"] <= 40.0


@pytest.mark.parametrize("scheduler", ["v1", "v0"])
def test_fast_path_runs_through_arrivals_behind_a_held_back_head(tiny_model: ModelSpec, clock_gpu: GpuSpec,
                                                                 scheduler: str) -> None:
    # 1 ms steps, 16 blocks of 4. A (10 + 30 tokens) holds 3 blocks after its prefill; B's prompt needs 14, so
    # memory holds B back until A finishes. C, D and E arrive mid-decode (5.5, 11.5, 17.5 ms) and queue behind B
    # (first come first served): no step changes. The fast path runs on through their arrivals (fewer passes than
    # one that stops at each) and must give what one step at a time gives.
    trace = trace_of((0.0, 10, 30), (0.0, 56, 1), (0.0055, 4, 2), (0.0115, 4, 2), (0.0175, 4, 2))
    config = SimConfig.of(tiny_model, clock_gpu, num_blocks=16, block_size=4, max_model_len=64, watermark=0.0,
                          scheduler=scheduler)

    def passes(bulk: bool, through_arrivals: bool) -> tuple[int, dict]:
        loop = Replay(trace, config, config.allocator("paged"), bulk, None)
        loop.bulk_advance.through_arrivals = through_arrivals
        count = 0
        while loop.scheduler.has_work:
            loop.iterate()
            count += 1
        return count, unrounded(loop.metrics())

    through, fast = passes(True, True)
    stopping, fast_stopping = passes(True, False)
    _, slow = passes(False, False)
    assert fast["completed_requests"] == 5 and fast["averaged_over"] == "saturated"
    assert through < stopping
    assert_same_replay(fast_stopping, dict(slow), scheduler)
    assert_same_replay(fast, slow, scheduler)


@pytest.mark.parametrize("scheduler", ["v1", "v0"])
def test_fast_path_decides_saturation_per_step(tiny_model: ModelSpec, clock_gpu: GpuSpec, scheduler: str) -> None:
    # max_num_seqs = 1 holds B (16 tokens: 4 blocks of 4) back while A (10 + 20) decodes in 10 blocks. A holds
    # 3 blocks after its prefill, so B would fit; from L = 25 on (7 blocks, 3 free) it would not: those steps are
    # saturated. Step by step sees that each step; the fast path, advancing A's decodes at once, must too (it
    # decided once, at the start of the run, and reported "busy").
    trace = trace_of((0.0, 10, 20), (0.0, 16, 1))
    config = SimConfig.of(tiny_model, clock_gpu, num_blocks=10, block_size=4, max_model_len=64, max_num_seqs=1,
                          watermark=0.0, prefix_caching=False, scheduler=scheduler)
    fast, slow = replay(trace, config, "paged"), replay(trace, config, "paged", bulk=False)
    assert slow.averaged_over == fast.averaged_over == "saturated"
    assert [fast.token_state_pct, fast.reserved_future_pct, fast.free_pct] == pytest.approx(
        [slow.token_state_pct, slow.reserved_future_pct, slow.free_pct], rel=1e-9)
