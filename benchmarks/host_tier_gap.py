"""Where the gap between ``simulate``'s GPU + host tier and a plain LRU of the same tokens comes from, by experiment:
the same replay with one candidate cause switched off at a time.

Replays a Mooncake trace under ``paged`` with prefix caching (Qwen3-8B on one H200, its default KV, v1), a host tier
making up ``--total`` tokens (``--offload-policy``), with the ``--variants`` given (joined by ``+``, several runs
separated by commas):

- ``base``: as ``simulate`` replays it;
- ``fastlink``: a host link 10^6 times faster (no store dropped, no load declined by the load-or-recompute rule);
- ``slow``: arrivals 10 times further apart (no queue: requests are admitted as they arrive, few in flight);
- ``sharedonly``: only the trace's shared segments' blocks are cached, on the GPU and below (no output blocks, no
  request's own prompt tokens take capacity), by wrapping ``BlockPool.cache`` for the run;
- ``gpuonly``: the whole total on the GPU, no host tier;
- ``exclusive``: ``--tier-inclusion exclusive`` (needs ``--offload-policy on-eviction``): a block the GPU caches,
  loaded or computed, leaves the host tier (a move, where vLLM's CPU LRU, HiCache and LMCache keep a copy), so no
  block is held by both tiers.

Prints per run the prompt tokens (%) the GPU found, the host tier loaded, and found (loaded + declined). Then the
naive LRU (``lru_reference``'s cache, requests in timestamp order, nothing in flight) at the GPU's 16-token
granularity over the shared segments' full blocks, and with each request's other prompt blocks and output blocks
taking capacity too (``--naive``).

    python -m benchmarks.host_tier_gap [--trace PATH] [--total 3000000] [--offload-policy on-eviction]
        [--variants base,fastlink,slow,sharedonly,fastlink+slow+sharedonly,gpuonly+sharedonly] [--naive]
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import time
from collections.abc import Hashable, Iterator, Sequence
from pathlib import Path

from benchmarks.lru_reference import HASH_BLOCK_TOKENS, TRACES, LRUCache
from benchmarks.replay_cpu import default_config
from minipaged_cli.memory.block_pool import BlockPool
from minipaged_cli.memory.prefix import block_content_keys
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import replay
from minipaged_cli.workloads.readers import load_trace
from minipaged_cli.workloads.trace import Trace

MAX_MODEL_LEN = 131_072
VARIANTS = ("base", "fastlink", "slow", "sharedonly", "gpuonly", "exclusive")


@contextlib.contextmanager
def shared_segments_only(trace: Trace, block_size: int) -> Iterator[None]:
    """While open, every ``BlockPool`` caches only blocks of the trace's shared segments (the rest are freed
    uncached, as a pool without prefix caching frees them)."""
    shared: set[Hashable] = set()
    for request in trace.requests:
        shared.update(block_content_keys([(name, trace.segments[name]) for name in request.prefix], block_size))
    cache = BlockPool.cache

    def cache_shared(pool: BlockPool, block_hashes: Sequence[Hashable], blocks: Sequence[int]) -> None:
        kept = [(h, block) for h, block in zip(block_hashes, blocks, strict=True) if h in shared]
        if kept:
            cache(pool, [h for h, _ in kept], [block for _, block in kept])

    BlockPool.cache = cache_shared  # type: ignore[method-assign]
    try:
        yield
    finally:
        BlockPool.cache = cache  # type: ignore[method-assign]


def run(trace: Trace, base: SimConfig, total: int, policy: str, variants: list[str]) -> dict[str, object]:
    unknown = set(variants) - set(VARIANTS)
    assert not unknown, f"unknown variants {unknown}; expected some of {VARIANTS}"
    if "gpuonly" in variants:
        config = base.with_settings(num_blocks=total // base.block_size)
    else:
        config = base.with_settings(offload_policy=policy,
                                    cpu_kv_blocks=(total - base.cache.num_blocks * base.block_size) // base.block_size,
                                    tier_inclusion="exclusive" if "exclusive" in variants else "inclusive")
    if "fastlink" in variants:
        config = dataclasses.replace(config, gpu=dataclasses.replace(
            config.gpu, host_bandwidth_bytes_per_s=config.gpu.host_bandwidth_bytes_per_s * 1e6))
    replayed = trace.time_scaled(10.0) if "slow" in variants else trace
    start = time.process_time()
    with shared_segments_only(trace, base.block_size) if "sharedonly" in variants else contextlib.nullcontext():
        metrics = replay(replayed, config, "paged")
    host = metrics.tiers.get("cpu")
    declined = 100 * host.recomputed_tokens / metrics.prefix_cache_queries if host else 0.0
    loaded = host.hit_pct if host else 0.0
    return {"variants": "+".join(variants), "gpu_pct": metrics.prefix_cache_hit_pct, "host_loaded_pct": loaded,
            "sum_loaded_pct": metrics.prefix_cache_hit_pct + loaded,
            "sum_found_pct": metrics.prefix_cache_hit_pct + loaded + declined,
            "dropped_stores": host.dropped_stores if host else 0, "ttft_mean_s": metrics.mean_ttft_s,
            "cpu_s": time.process_time() - start}


def naive_hit_pct(path: Path, capacity_tokens: int, block_size: int, own_prompt: bool, outputs: bool) -> float:
    """The naive LRU at ``block_size`` over the full 512-token hash blocks; with ``own_prompt`` a request's last,
    partial block's whole ``block_size`` blocks, and with ``outputs`` its output's, are inserted after its prompt
    too (unique keys: they take capacity and are never hit)."""
    with open(path) as f:
        rows = sorted((json.loads(line) for line in f if line.strip()), key=lambda row: row["timestamp"])
    cache = LRUCache(capacity_tokens // block_size)
    per_block = HASH_BLOCK_TOKENS // block_size
    hit_tokens = prompt_tokens = 0
    for index, row in enumerate(rows):
        prompt = row["input_length"]
        prompt_tokens += prompt
        full = prompt // HASH_BLOCK_TOKENS * per_block
        keys = [(row["hash_ids"][i // per_block], i % per_block) for i in range(full)]
        for key in keys:
            if key not in cache:
                break
            hit_tokens += block_size
        end = prompt + row["output_length"] - 1 if outputs else prompt if own_prompt else 0
        for key in keys + [("own", index, i) for i in range(full, end // block_size)]:
            cache.touch(key)
    return 100 * hit_tokens / prompt_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", type=Path, default=TRACES / "mooncake_conversation_trace.jsonl")
    parser.add_argument("--total", type=int, default=3_000_000, help="GPU + host tokens")
    parser.add_argument("--offload-policy", default="on-eviction")
    parser.add_argument("--variants", default="base,fastlink,slow,sharedonly,fastlink+slow+sharedonly,"
                                               "gpuonly+sharedonly")
    parser.add_argument("--naive", action="store_true", help="also the naive LRU's three variants")
    args = parser.parse_args()

    trace = load_trace(args.trace)
    base = default_config(MAX_MODEL_LEN, prefix_caching=True, scheduler="v1")
    print(f"{trace.name}, {args.total:,} tokens, {args.offload_policy} (% of prompt tokens)")
    print(f"{'variants':<28} {'GPU':>6} {'host':>6} {'loaded':>6} {'found':>6} {'dropped':>8} {'TTFT s':>8} "
          f"{'cpu s':>6}")
    for variants in filter(None, args.variants.split(",")):  # (--variants '': the naive LRU alone)
        row = run(trace, base, args.total, args.offload_policy, variants.split("+"))
        print(f"{row['variants']:<28} {row['gpu_pct']:>6.2f} {row['host_loaded_pct']:>6.2f} "
              f"{row['sum_loaded_pct']:>6.2f} {row['sum_found_pct']:>6.2f} {row['dropped_stores']:>8,} "
              f"{row['ttft_mean_s']:>8.1f} {row['cpu_s']:>6.1f}", flush=True)
    if args.naive:
        for label, own_prompt, outputs in (("naive, 16-token blocks", False, False),
                                           ("  + own prompt blocks", True, False),
                                           ("  + output blocks", True, True)):
            print(f"{label:<28} {naive_hit_pct(args.trace, args.total, base.block_size, own_prompt, outputs):>6.2f}")


if __name__ == "__main__":
    main()
