"""What KV cache groups cost the block manager alone: vLLM 0.33.0's own ``KVCacheManager`` and minipaged's
``KVBlockManager`` under KV cache groups driven through the same operations (admit a prompt, decode a token at a
time, free), once
with the model's KV cache groups and once with every layer as full attention (one group), on the same KV memory.
The ratio of the two says what the groups cost vLLM's code itself: the yardstick for ``hybrid_bench.py``'s replay
ratio, since the replay must make the same per-group block decisions.

Runs with the vLLM reference venv's python (``parity/setup_env.sh``), the repository on ``PYTHONPATH``:

    PYTHONPATH=. ~/.cache/minipaged/vllm-0.33.0/bin/python benchmarks/hybrid_manager_cost.py --model gemma-3-27b

Requests come from the trace in order, ``--running`` at a time, each prefilled in one call then decoded one token
per step; every prompt is its own (random tokens: no prefix hits, as on Azure's traces), prefix caching on as in
vLLM. Only the manager's calls are timed (a stopwatch around each, its own cost taken out); vLLM's block hashing,
done by its ``Request`` as tokens are appended, is outside them. Prints the seconds per manager and layout, best
of ``--repeat``, and the two ratios.
"""

from __future__ import annotations

import argparse
import random
import time
from pathlib import Path

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
from vllm.v1.request import Request as VllmRequest

from minipaged_cli.memory.block_manager import KVBlockManager
from minipaged_cli.memory.prefix import hash_blocks
from minipaged_cli.sim.config import DEFAULT_BLOCK_SIZE, SimConfig
from minipaged_cli.sim.kv_sizing import resolve_num_blocks
from minipaged_cli.workloads.presets import load_gpu, load_model
from minipaged_cli.workloads.readers import load_trace

MAX_MODEL_LEN = 32768
MAX_PROMPT = 8000  # prompts are cut here: one prefill call fits the in-flight token budget
IN_FLIGHT_TOKENS = 8192


class Stopwatch:
    """The seconds spent inside its ``with`` blocks, less what an empty block costs (its own timing: about 0.1 us,
    the same for both managers, so left in it would flatten their ratios)."""

    def __init__(self) -> None:
        self.seconds, self.laps = 0.0, 0

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *exc_info: object) -> None:
        self.seconds += time.perf_counter() - self._start
        self.laps += 1

    def net_seconds(self) -> float:
        empty = []
        for _ in range(5):
            probe = Stopwatch()
            for _ in range(10_000):
                with probe:
                    pass
            empty.append(probe.seconds / probe.laps)
        return self.seconds - self.laps * min(empty)


def vllm_manager(config: SimConfig) -> KVCacheManager:
    """vLLM's manager over the config's groups (one layer each: the page size does not change what it decides)."""
    groups = []
    for g, group in enumerate(config.kv_cache_groups):
        spec = (SlidingWindowSpec(block_size=config.block_size, num_kv_heads=1, head_size=8, dtype=torch.float16,
                                  sliding_window=group.sliding_window) if group.is_sliding else
                FullAttentionSpec(block_size=config.block_size, num_kv_heads=1, head_size=8, dtype=torch.float16))
        groups.append(KVCacheGroupSpec([f"layer.{g}"], spec))
    kv_config = KVCacheConfig(num_blocks=config.cache.num_blocks + 1, kv_cache_tensors=[], kv_cache_groups=groups)
    return KVCacheManager(kv_config, max_model_len=MAX_MODEL_LEN, scheduler_block_size=config.block_size,
                          hash_block_size=config.block_size, max_in_flight_tokens=IN_FLIGHT_TOKENS,
                          enable_caching=True)


def workload(trace_path: Path, limit: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """(prompt tokens, output tokens) per request: the trace's lengths, random token ids."""
    rng = random.Random(seed)
    return [([rng.randrange(50000) for _ in range(min(r.prompt_tokens, MAX_PROMPT))],
             [rng.randrange(50000) for _ in range(r.output_tokens)])
            for r in load_trace(trace_path, "auto", limit=limit).requests]


def time_vllm(config: SimConfig, requests: list[tuple[list[int], list[int]]], running: int) -> float:
    manager, hasher = vllm_manager(config), get_request_block_hasher(config.block_size, sha256)
    watch, live, pending = Stopwatch(), [], list(enumerate(requests))
    pending.reverse()
    while pending or live:
        while pending and len(live) < running:
            index, (prompt, outputs) = pending.pop()
            request = VllmRequest(str(index), prompt, SamplingParams(max_tokens=len(outputs)), None,
                                  block_hasher=hasher)
            with watch:
                blocks, hit = manager.get_computed_blocks(request)[:2]
                allocated = manager.allocate_slots(request, len(prompt) - hit, hit, blocks,
                                                   full_sequence_must_fit=True)
            assert allocated is not None, "the pool is too small for --running requests"
            request.num_computed_tokens = len(prompt)
            request.append_output_token_ids(outputs[0])
            live.append((request, outputs))
        still = []
        for request, outputs in live:
            done = request.num_output_tokens >= len(outputs)
            with watch:
                grown = manager.free(request) if done else manager.allocate_slots(request, 1)
            assert done or grown is not None, "the pool is too small"
            if not done:
                request.num_computed_tokens += 1
                request.append_output_token_ids(outputs[request.num_output_tokens])
                still.append((request, outputs))
        live = still
    return watch.net_seconds()


def time_minipaged(config: SimConfig, requests: list[tuple[list[int], list[int]]], running: int) -> float:
    manager = KVBlockManager(config.cache.num_blocks, config.block_size, config.kv_cache_groups,
                                 enable_prefix_caching=True, max_in_flight_tokens=IN_FLIGHT_TOKENS,
                                 max_model_len=MAX_MODEL_LEN)
    block_size = config.block_size
    watch, live, pending = Stopwatch(), [], list(enumerate(requests))
    pending.reverse()
    while pending or live:
        while pending and len(live) < running:
            index, (prompt, outputs) = pending.pop()
            tokens = prompt + outputs
            hashes = hash_blocks(tuple(tokens[i:i + block_size])
                                 for i in range(0, len(tokens) - block_size + 1, block_size))
            with watch:
                manager.create_sequence(index, len(prompt), block_hashes=hashes)
            live.append((index, len(outputs) - 1))  # the prefill sampled the first output token
        still = []
        for sequence_id, remaining in live:
            with watch:
                if remaining:
                    manager.grow(sequence_id, 1)
                else:
                    manager.release_sequence(sequence_id)
            if remaining:
                still.append((sequence_id, remaining - 1))
        live = still
    return watch.net_seconds()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gemma-3-27b", help="a preset or config.json with sliding-window layers")
    parser.add_argument("--trace", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "traces"
                        / "AzureLLMInferenceTrace_conv.csv")
    parser.add_argument("--limit", type=int, default=300, help="requests from the trace")
    parser.add_argument("--running", type=int, default=48, help="requests running at once")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each; the best counts")
    args = parser.parse_args()
    init_none_hash(sha256)
    model, gpu = load_model(args.model), load_gpu("h200")
    num_blocks, _, _ = resolve_num_blocks(model, gpu, DEFAULT_BLOCK_SIZE, None, None, None)  # simulate's default pool
    hybrid = SimConfig.of(model, gpu, num_blocks=num_blocks, block_size=DEFAULT_BLOCK_SIZE,
                          max_model_len=MAX_MODEL_LEN)
    configs = {"KV cache groups": hybrid, "all full attention": hybrid.all_full_attention()}
    requests = workload(args.trace, args.limit, seed=0)
    managers = {"vLLM 0.33.0": time_vllm, "minipaged": time_minipaged}
    seconds = {(m, c): float("inf") for m in managers for c in configs}
    for _ in range(args.repeat):
        for (manager, label), best in list(seconds.items()):
            seconds[manager, label] = min(best, managers[manager](configs[label], requests, args.running))
    full_blocks = configs["all full attention"].cache.num_blocks
    print(f"{args.model}: {len(hybrid.kv_cache_groups)} KV cache groups ({hybrid.cache.num_blocks:,} blocks) against "
          f"one ({full_blocks:,} blocks); {len(requests)} requests, {args.running} at once")
    for manager in managers:
        grouped, full = seconds[manager, "KV cache groups"], seconds[manager, "all full attention"]
        print(f"{manager:>12}: groups {grouped:6.3f} s, all full {full:6.3f} s: {grouped / full:.2f}x")


if __name__ == "__main__":
    main()
