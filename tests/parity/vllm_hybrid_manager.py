"""Run with the vLLM reference venv's python (``tests/parity/test_hybrid.py`` does): minipaged's ``KVBlockManager``
under KV cache groups and vLLM 0.33.0's own ``KVCacheManager`` (its ``HybridKVCacheCoordinator`` over a
``SlidingWindowManager`` and a ``FullAttentionManager`` per group, one ``BlockPool``) driven in lockstep through
random workloads: prompts sharing documents (prefix hits from the left for full attention, from the right for the
window), chunked prefills, decode tokens (windows sliding, null blocks), the admission gate with its
sliding-window cap, releases and evictions. After every operation: every group's block table (vLLM's null block 0
is our -1, its ids are ours + 1), the whole free queue in order, and each admission's hit length. Prints one line;
exits non-zero (an assertion naming seed and step) on the first difference."""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, SlidingWindowSpec
from vllm.v1.request import Request

from minipaged_cli.memory import OutOfBlocksError, hash_blocks
from minipaged_cli.memory.block_manager import KVBlockManager
from minipaged_cli.memory.kv_groups import KVCacheGroup

LAYOUTS = (("sliding", "full"), ("full", "sliding"), ("sliding", "sliding", "full"))
MAX_MODEL_LEN = 4096


def vllm_manager(layout: tuple[str, ...], num_blocks: int, block_size: int, window: int, caching: bool,
                 in_flight: int) -> KVCacheManager:
    specs = {"full": FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8, dtype=torch.float16),
             "sliding": SlidingWindowSpec(block_size=block_size, num_kv_heads=1, head_size=8, dtype=torch.float16,
                                          sliding_window=window)}
    groups = [KVCacheGroupSpec([f"layer.{i}"], specs[kind]) for i, kind in enumerate(layout)]
    config = KVCacheConfig(num_blocks=num_blocks + 1, kv_cache_tensors=[], kv_cache_groups=groups)
    return KVCacheManager(config, max_model_len=MAX_MODEL_LEN, scheduler_block_size=block_size,
                          hash_block_size=block_size, max_in_flight_tokens=in_flight, enable_caching=caching)


def step_ran(request: Request, num_computed: int, tokens: list[int], prompt_length: int) -> None:
    """The scheduled step ran: its tokens are computed, and a step that reaches the prompt's end samples one."""
    request.num_computed_tokens = num_computed
    if num_computed >= prompt_length:
        request.append_output_token_ids(tokens[request.num_tokens])


def run(seed: int, caching: bool) -> tuple[int, int]:
    rng = random.Random(seed)
    layout = rng.choice(LAYOUTS)
    num_blocks, block_size, window = rng.randint(6, 60), rng.choice([1, 2, 4]), rng.randint(1, 12)
    in_flight = rng.randint(1, 16)
    groups = [KVCacheGroup("sliding_attention" if kind == "sliding" else "full_attention", (i,), 1,
                           window if kind == "sliding" else None) for i, kind in enumerate(layout)]
    ours = KVBlockManager(num_blocks, block_size, groups, enable_prefix_caching=caching,
                              max_in_flight_tokens=in_flight, max_model_len=MAX_MODEL_LEN)
    theirs = vllm_manager(layout, num_blocks, block_size, window, caching, in_flight)
    hasher = get_request_block_hasher(block_size, sha256)
    documents = [[rng.randrange(1000) for _ in range(rng.randint(1, 30))] for _ in range(3)]
    live: dict[int, tuple[Request, list[int], int]] = {}  # sid -> (vLLM's request, every token, prompt length)
    num_hits = 0
    for step in range(80):
        sid, action = rng.randint(0, 6), rng.random()
        if sid not in live and action < 0.5:
            prompt = rng.choice(documents) + [rng.randrange(1000) for _ in range(rng.randint(0, 8))]
            tokens = prompt + [rng.randrange(1000) for _ in range(40)]  # the outputs to come, known to us up front
            hashes = hash_blocks(tuple(tokens[i:i + block_size])
                                 for i in range(0, len(tokens) - block_size + 1, block_size))
            request = Request(str(sid), prompt, SamplingParams(max_tokens=40), None, block_hasher=hasher)
            hit_blocks, hit, _ = theirs.get_computed_blocks(request)
            assert ours.num_cached_tokens(len(prompt), hashes) == hit, (seed, step, "hit length")
            num_hits += hit > 0
            chunk = rng.randint(1, len(prompt) - hit)
            fits = ours.blocks_needed(None, len(prompt), hashes) <= ours.num_free_blocks
            if fits:
                try:
                    ours.create_sequence(sid, hit + chunk, block_hashes=hashes)
                except OutOfBlocksError:  # the gate passed but the chunk itself does not fit
                    fits = False
            new = theirs.allocate_slots(request, chunk, hit, hit_blocks, full_sequence_must_fit=True)
            assert (new is not None) == fits, (seed, step, "admission", fits)
            if fits:
                live[sid] = (request, tokens, len(prompt))
                step_ran(request, hit + chunk, tokens, len(prompt))
        elif sid in live and action < 0.85:
            request, tokens, prompt_length = live[sid]
            computed = request.num_computed_tokens
            num_new = rng.randint(1, prompt_length - computed) if computed < prompt_length else 1
            try:
                ours.grow(sid, num_new)
                grown = True
            except OutOfBlocksError:  # vLLM must refuse too
                grown = False
            assert (theirs.allocate_slots(request, num_new) is not None) == grown, (seed, step, "grow")
            if grown:
                step_ran(request, computed + num_new, tokens, prompt_length)
        elif sid in live:
            ours.release_sequence(sid)
            theirs.free(live.pop(sid)[0])
        for key, (request, _, _) in live.items():
            expected = [[block - 1 for block in table] for table in theirs.get_block_ids(request.request_id)]
            assert ours.sequences[key].block_tables == expected, (seed, step, key, ours.sequences[key].block_tables,
                                                                  expected)
        free = [b.block_id - 1 for b in theirs.block_pool.free_block_queue.get_all_free_blocks()]
        assert list(ours.pool.free_blocks) == free, (seed, step, list(ours.pool.free_blocks), free)
        assert not ours.invariant_violations(), (seed, step, ours.invariant_violations())
    return step + 1, num_hits


if __name__ == "__main__":
    init_none_hash(sha256)
    results = [run(seed, caching) for seed in range(120) for caching in (False, True)]
    operations, hits = sum(r[0] for r in results), sum(r[1] for r in results)
    print(f"agreed with vLLM's hybrid KVCacheManager over {operations} operations in {len(results)} random "
          f"workloads ({hits} admissions with prefix hits)")
