"""The simulator on models with sliding-window layers: a replay worked by hand, the fast path against step-by-step
replay, capacity as vLLM computes it, and the comparison with every layer as full attention."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from minipaged_cli.errors import InputError
from minipaged_cli.memory import hash_blocks
from minipaged_cli.memory.allocators import Holding
from minipaged_cli.memory.kv_groups import kv_cache_groups
from minipaged_cli.memory.paged import PagedAllocator
from minipaged_cli.memory.strategies import STRATEGIES
from minipaged_cli.sim.admission import AdmissionPolicy
from minipaged_cli.sim.config import SimConfig, num_blocks_for_memory
from minipaged_cli.sim.replay import replay, simulate
from minipaged_cli.workloads.presets import FULL_ATTENTION, SLIDING_ATTENTION, GpuSpec, ModelSpec, load_gpu
from minipaged_cli.workloads.trace import Request, make_trace
from tests.sim.test_replay import SEGMENTS, assert_same_replay, unrounded


def windowed_model(num_layers: int = 2, window: int = 4, *, kv_heads: int = 1, head_dim: int = 8) -> ModelSpec:
    """Layers alternating sliding window / full attention, sliding first (gpt-oss's pattern)."""
    kinds = tuple(SLIDING_ATTENTION if i % 2 == 0 else FULL_ATTENTION for i in range(num_layers))
    return ModelSpec(name="windowed", num_layers=num_layers, hidden_size=8, intermediate_size=8, num_q_heads=kv_heads,
                     num_kv_heads=kv_heads, head_dim=head_dim, vocab_size=8, tie_word_embeddings=True,
                     gated_mlp=True, dtype="float16", max_model_len=1024, layer_types=kinds, sliding_window=window)


def test_one_request_by_hand(clock_gpu: GpuSpec) -> None:
    # 2 layers (sliding window 4, full), a group each; block 4, 10 blocks = 40 slots; prompt 10, output 5.
    # Step 1 prefills 10 tokens: 3 blocks a group (24 slots), tokens 10 + 10. Then each decode's grow slides the
    # window with C computed (max(0, C - 4 + 1) // 4 blocks skipped) before taking its block:
    #   step  L   skipped  held (full + sliding)  allocated  tokens (L + L - 4 skipped)  internal 2 max(4e - 14, 0)
    #   1     10  0        3 + 3                  24         20                          0
    #   2     11  1        3 + 2                  20         11 + 7 = 18                 0
    #   3     12  2        3 + 1                  16         12 + 4 = 16                 0
    #   4     13  2        4 + 2                  24         13 + 5 = 18                 4
    #   5     14  2        4 + 2                  24         14 + 6 = 20                 4
    # means over 5 ms, % of 40: tokens 92/5 -> 46 %, usage 108/5 -> 54 %, internal 8/5 -> 4 %, reserved 4 %.
    config = SimConfig.of(windowed_model(), clock_gpu, num_blocks=10, block_size=4, max_model_len=20)
    trace = make_trace("t", [Request("r0", 0.0, 10, 5)], source="test")
    for bulk in (True, False):
        paged = replay(trace, config, "paged", bulk=bulk)
        assert paged.token_state_pct == pytest.approx(46.0)
        assert paged.kv_cache_usage_perc == pytest.approx(54.0)
        assert paged.internal_frag_pct == pytest.approx(4.0)
        assert paged.reserved_future_pct == pytest.approx(4.0)
        assert paged.free_pct == pytest.approx(46.0)
    # oracle-reserve, contiguous: 15 tokens in the full layer, the window's 4 in the sliding one: 19 slots; tokens
    # L + min(L, 4) = 14..18 (mean 16: 40 %), usage 19 (47.5 %), internal 19 - (14 + 4) = 1 (2.5 %)
    oracle = replay(trace, config, "oracle-reserve")
    assert (oracle.token_state_pct, oracle.kv_cache_usage_perc, oracle.internal_frag_pct) == pytest.approx(
        (40.0, 47.5, 2.5))
    # every layer as full attention: the same 40 slots of one layer = 20 blocks of 2 layers' pages... of block 4
    # -> 5 blocks; the request holds 3, then 4 blocks: 12, 12, 12, 16, 16 -> 68/5 = 13.6 of 20 (68 %)
    full_config = config.all_full_attention()
    assert full_config.cache.num_blocks == 5
    assert replay(trace, full_config, "paged").kv_cache_usage_perc == pytest.approx(68.0)


def test_blocks_from_memory_as_vllm_sizes_them() -> None:
    # gpt-oss-20b's KV: 24 layers (12 sliding + 12 full: two groups of 12), 8 KV heads x 64, bf16.
    # One layer's page of 16 tokens: 16 x 2 (K, V) x 8 x 64 x 2 B = 32 KiB; a hybrid block holds a group's 12
    # pages (384 KiB), a block without the hybrid manager all 24 (768 KiB): 1 GiB holds 2,730 and 1,365 blocks.
    model = windowed_model(24, 128, kv_heads=8, head_dim=64)
    assert num_blocks_for_memory(2**30, model, 16) == 2**30 // (12 * 32 * 1024) == 2730
    assert num_blocks_for_memory(2**30, model, 16, hybrid=False) == 1365
    # vLLM's "KV cache size": max_model_len 131,072 takes 8,192 blocks in the full group and, in the sliding one,
    # ceil((128 - 1 + 8,192) / 16) + 1 = 521 (a window plus a step of 8,192 tokens): 2,730 / 8,713 x 131,072
    config = SimConfig.of(model, load_gpu("h200"), num_blocks=2730, block_size=16, max_model_len=131072)
    assert config.kv_size_tokens == int(2730 / (8192 + 521) * 131072)
    assert config.all_full_attention().kv_size_tokens == 1365 * 16
    assert config.kv_memory_bytes == config.all_full_attention().kv_memory_bytes == 2730 * 12 * 32 * 1024


def test_simulate_compares_with_every_layer_full(clock_gpu: GpuSpec) -> None:
    # Long decodes past a 4-token window: the hybrid pool holds twice the blocks, and its sliding group keeps at
    # most 2-3 of them per request, so more requests run at once than with every layer full on the same memory.
    requests = [Request(f"r{i}", 0.0, 8, 60) for i in range(12)]
    config = SimConfig.of(windowed_model(), clock_gpu, num_blocks=80, block_size=4, max_model_len=128)
    result = simulate(make_trace("t", requests, source="test"), config, ("paged", "oracle-reserve"))
    full_config, full = result.all_full_attention
    assert full_config.cache.num_blocks == 40 and not full_config.cache.hybrid_kv
    hybrid = result.strategies["paged"]
    assert hybrid.mean_batch_size > full.mean_batch_size
    assert hybrid.throughput_tokens_per_s > full.throughput_tokens_per_s
    document = result.to_dict()
    assert document["paged_all_full_attention"]["num_blocks"] == 40
    assert document["config"]["kv_cache_groups"] == 2
    no_hybrid = SimConfig.of(windowed_model(), clock_gpu, num_blocks=40, block_size=4, max_model_len=128,
                             hybrid_kv=False)
    assert simulate(make_trace("t", requests, source="test"), no_hybrid, ("paged",)).all_full_attention is None


def test_v0_has_no_hybrid_manager(clock_gpu: GpuSpec) -> None:
    with pytest.raises(InputError, match="hybrid_kv=False"):
        SimConfig.of(windowed_model(), clock_gpu, num_blocks=10, scheduler="v0", hybrid_kv=True)
    assert not SimConfig.of(windowed_model(), clock_gpu, num_blocks=10, scheduler="v0").cache.hybrid_kv


@pytest.mark.slow
@settings(max_examples=8, deadline=None)
@given(seed=st.integers(0, 10_000), block_size=st.sampled_from([1, 4, 16]), window=st.sampled_from([1, 5, 32, 128]),
       chunk=st.sampled_from([64, 2048]), num_blocks=st.integers(30, 120), sharing=st.booleans(),
       layers=st.sampled_from([2, 7]))
# Shared blocks leaving a window: a bulk advance held the shared slots constant (token states 0.27 % off).
@example(seed=0, block_size=1, window=128, chunk=2048, num_blocks=41, sharing=True, layers=2)
def test_fast_path_equals_step_by_step(seed: int, block_size: int, window: int, chunk: int, num_blocks: int,
                                       sharing: bool, layers: int) -> None:
    # As tests/sim/test_replay.py's test of the same name, with sliding windows freeing blocks between events (7
    # layers: 4 sliding + 3 full -> groups of 3, the sliding layers in two padded groups).
    rng = np.random.default_rng(seed)
    requests = []
    for i in range(int(rng.integers(3, 25))):
        prefix = tuple(rng.choice(["sys", "doc"], size=int(rng.integers(0, 3)))) if sharing else ()
        prompt = sum(SEGMENTS[s] for s in prefix) + int(rng.integers(1, 300))
        requests.append(Request(f"r{i}", float(rng.uniform(0, 1.5)), prompt, int(rng.integers(1, 200)), prefix))
    model = windowed_model(layers, window)
    pool_blocks = num_blocks * 16 // block_size * len(kv_cache_groups(model))
    config = SimConfig.of(model, load_gpu("h200"), num_blocks=pool_blocks,
                          block_size=block_size, max_model_len=1024, max_batched_tokens=chunk, check_invariants=True,
                          prefix_caching=sharing)
    trace = make_trace("t", requests, source="test", segments=SEGMENTS)
    for strategy in STRATEGIES:
        assert_same_replay(unrounded(replay(trace, config, strategy)),
                           unrounded(replay(trace, config, strategy, bulk=False)), strategy)


def test_admission_counts_the_first_chunk_where_the_window_cap_counts_less() -> None:
    # vLLM admits when its gate (the whole prompt, a sliding group capped at ceil((W - 1 + 4) / 1) + 1 = 9 blocks)
    # and the first chunk's allocation both fit, with the watermark (10 blocks here) on top. Block size 1, window 5,
    # a step of 4 tokens. "a" (20 tokens, cached in both groups, then released) leaves 40 free cached blocks.
    # "b" (24 tokens, the first 20 as "a"'s): full attention hits 20, the window's last 4 are cached too, so
    # 20 tokens hit and max(0, 20 - 5 + 1) = 16 sliding blocks are skipped.
    #   gate:  full 24 - 20 new + 20 revived; sliding min(24, 9) - max(16, 20) -> 0 new + 4 revived: 28
    #   chunk (20 + 4 tokens): full 4 + 20; sliding 24 - 20 = 4 new + 4 revived: 32
    # 32 + 10 > 40 free: refused, although the gate alone (28 + 10) would pass.
    groups = kv_cache_groups(windowed_model(2, 5))
    allocator = PagedAllocator(42, 1, groups, prefix_caching=True, max_in_flight_tokens=4, max_model_len=100)
    admission = AdmissionPolicy(watermark_blocks=10)  # v1's
    hashes = hash_blocks(("doc", i) for i in range(30))
    allocator.admit(Holding(0, 1, 1), 1)  # keeps a sequence running: v1's watermark holds
    allocator.admit(Holding(1, 20, 1, hashes[:20]), 20)
    allocator.release(Holding(1, 20, 1))
    assert allocator.manager.num_free_blocks == 40
    head = Holding(2, 24, 1, hashes[:20] + hash_blocks(("own", i) for i in range(4)))
    assert allocator.manager.blocks_needed(None, 24, head.block_hashes) == 28
    assert allocator.manager.blocks_to_create(24, head.block_hashes) == 32
    assert admission.headroom(allocator, head, 24) == 40 - 32 - 10
