"""The tiers' bookkeeping stays within the blocks held (memory linear in blocks, not in requests): the names of output
blocks that the tiers keep so as never to store them are at most the GPU's cached blocks once the requests are
done, not one per request of the trace. ``benchmarks/tiers_memory.py`` measures the bytes."""

from __future__ import annotations

import dataclasses
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged_cli.memory.tier_store import ARCStore, LRUStore
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import Replay
from minipaged_cli.workloads.presets import load_gpu, load_model
from minipaged_cli.workloads.trace import Request, make_trace
from tests.sim.test_tiers import random_trace

BLOCK = 16


def replayed(trace, model: str = "qwen3-8b", **settings_: object) -> Replay:
    config = SimConfig.of(load_model(model), load_gpu("h200"), block_size=BLOCK, **settings_)
    run = Replay(trace, config, config.allocator("paged"), True, None)
    run.run()
    return run


@pytest.mark.parametrize(("model", "groups"), [("qwen3-8b", 1), ("gpt-oss-20b", 2)])
def test_a_finished_request_leaves_only_its_cached_output_blocks_named(model: str, groups: int) -> None:
    # A 64-token prompt and 32 output tokens: 96 tokens, six full blocks by content, but no step computes the last
    # token's K/V (the request ends when it is sampled), so the GPU caches blocks 0-4 and never block 5. Of the two
    # output blocks (4, 5) named at admission, only block 4 is held by the GPU: block 5's name must go with the
    # request, or every request whose length is a multiple of the block size leaves one name behind for good.
    trace = make_trace("one", [Request("a", 0.0, 64, 32, prefix=("sys",))], source="test", segments={"sys": 64})
    run = replayed(trace, model, num_blocks=64, cpu_kv_blocks=64)
    cached = run.allocator.manager.pool.keyed_cache()[0]  # keys as the tiers name them
    assert len(cached) == 5 * groups  # blocks 0-4, in each KV cache group
    assert len(run.tiers.output_hashes) == groups and run.tiers.output_hashes <= cached.keys()


@settings(max_examples=12, deadline=None)
@given(st.integers(0, 10_000), st.integers(8, 20), st.sampled_from(["write-through", "on-eviction"]))
def test_output_names_are_within_the_gpu_cache_after_a_replay(seed: int, num_blocks: int, policy: str) -> None:
    # Small pools preempt and reject requests: whatever way a request ends, its output blocks that no GPU block
    # holds are never cached again (their content is its own), so after the replay every name is a cached block.
    run = replayed(random_trace(seed, 25, 0.01), num_blocks=num_blocks, cpu_kv_blocks=12, offload_policy=policy,
                   max_model_len=512)
    assert run.tiers.output_hashes <= run.allocator.manager.pool.cached_blocks[0].keys()


def test_stores_count_the_hashes_they_keep() -> None:
    # What tiers_memory.py divides the heap by. Capacity 2, three blocks stored: LRU keeps the 2 it holds; ARC also
    # remembers the evicted one in its ghost list B1 (b and c stored, a a ghost), and a reuse moves a block from T1
    # to T2 without keeping another hash.
    lru, arc = LRUStore(2), ARCStore(2)
    for store in (lru, arc):
        store.insert(["a", "b", "c"])
    arc.hit(["c"])
    assert (lru.num_kept_hashes, arc.num_kept_hashes) == (2, 3)


def long_outputs(seed: int):
    """Twelve requests 10 ms apart on three shared prompts, each with 60-120 output tokens (several output blocks)."""
    rng = random.Random(seed)
    segments = {f"s{i}": BLOCK * rng.randint(1, 4) for i in range(3)}
    requests = [Request(f"r{i}", i * 0.01, 0, rng.randint(60, 120), prefix=(f"s{rng.randint(0, 2)}",))
                for i in range(12)]
    requests = [dataclasses.replace(r, prompt_tokens=segments[r.prefix[0]] + rng.randint(1, 20)) for r in requests]
    return make_trace("long outputs", requests, source="test", segments=segments)


def test_a_request_rejected_after_its_preemption_leaves_no_output_names() -> None:
    # Under v0 with a 30 % watermark on 10 blocks, one request is preempted mid-decode and then no longer fits beside
    # the watermark: rejected, the output blocks it never reached are never computed, so their names must go too.
    run = replayed(long_outputs(7), num_blocks=10, cpu_kv_blocks=12, max_model_len=512, scheduler="v0",
                   watermark=0.3, prefix_caching=True)
    assert any("preempted" in reason for reason in run.accounting.rejection_reasons)
    assert run.tiers.output_hashes <= run.allocator.manager.pool.cached_blocks[0].keys()
