"""The host tiers' anchors on the Mooncake traces, as the simulator meets them: what the importer makes cacheable, and
the GPU + host tiers against LMCache's simulator (``benchmarks/lru_reference.py``, which reproduces it)."""

from __future__ import annotations

from pathlib import Path

from benchmarks.host_tier_anchors import TierWatch, served_requests
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import replay
from minipaged_cli.workloads.presets import load_gpu, load_model
from minipaged_cli.workloads.readers import load_trace
from tests.sim.test_tiers import config, three_requests


def test_a_repeated_prompt_finds_its_partial_last_block(tmp_path: Path) -> None:
    # The same 1,100-token prompt (hash_ids 0, 1, 2: two full 512-token blocks and 76 tokens) twice, the second
    # long after the first is done. Hand count for the second request with 16-token KV blocks: every full block of
    # the prompt short of the last token, which is always computed: (1100 - 1) // 16 = 68 blocks = 1,088 tokens.
    # (LMCache's simulator finds the complete 256-token chunks: 1,024; dropping the partial block gave 1,024 too.)
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1100, "output_length": 4, "hash_ids": [0, 1, 2]}\n'
                    '{"timestamp": 60000, "input_length": 1100, "output_length": 4, "hash_ids": [0, 1, 2]}\n')
    config = SimConfig.of(load_model("qwen3-8b"), load_gpu("h200"), num_blocks=1000, block_size=16, prefix_caching=True)
    metrics = replay(load_trace(path), config, "paged")
    assert (metrics.prefix_cache_queries, metrics.prefix_cache_hits) == (2200, 1088)


def test_the_served_hit_rate_counts_the_accepted_among_the_replayed_requests(tmp_path: Path) -> None:
    # host_tier_anchors --limit 2 replays the first two requests; of those only the first fits in 131,072 tokens,
    # so the LMCache figure over the served requests covers that one alone (not the third, the second accepted).
    path = tmp_path / "m.jsonl"
    path.write_text('{"timestamp": 0, "input_length": 1000, "output_length": 4, "hash_ids": [0, 1]}\n'
                    '{"timestamp": 1, "input_length": 131072, "output_length": 4, "hash_ids": [2]}\n'
                    '{"timestamp": 2, "input_length": 2000, "output_length": 4, "hash_ids": [3, 4, 5, 6]}\n')
    served = served_requests(path, load_trace(path, limit=2))
    assert [request.input_length for request in served] == [1000]


def test_the_watch_counts_the_blocks_both_tiers_hold_and_changes_nothing() -> None:
    # --both-tiers on test_tiers' three requests (write-through, host tier of 8, GPU pool of 5), sampled at every
    # flush, before its stores: A's and B's steps each end with their 4 blocks on the GPU only (B's allocation
    # evicted A's). C's load (a scheduling of loads alone) is given the free block and 3 of B's 4 cached ones, the
    # last first: B's first block stays cached on the GPU, and the host tier holds it: 1 in both. At C's step's
    # end the GPU caches A's 4 loaded blocks, which the host tier holds too (B's first block went to C's 5th): 4.
    trace, cfg = three_requests(), config(cpu_kv_blocks=8)
    with TierWatch(span_s=1.0, num_samples=10**9) as watch:
        watched = replay(trace, cfg, "paged")
    assert [both for _, _, both in watch.samples] == [0, 0, 1, 4]
    assert watched.to_dict() == replay(trace, cfg, "paged").to_dict()


def test_the_watch_finds_no_block_twice_under_exclusive_tiers() -> None:
    # test_tiers_exclusive's X, Y, Z, X, Y, Z: every load's blocks leave the host tier as the GPU caches them, at
    # the latest when the load's copy ends, before the step's end the watch samples at.
    from tests.sim.test_tiers_exclusive import three_segments_twice, tiers_config

    with TierWatch(span_s=1.0, num_samples=10**9) as watch:
        metrics = replay(three_segments_twice(), tiers_config("exclusive", cpu_kv_blocks=8), "paged")
    assert metrics.tiers["cpu"].loaded_bytes > 0 and len(watch.samples) >= 6
    assert [both for _, _, both in watch.samples] == [0] * len(watch.samples)
