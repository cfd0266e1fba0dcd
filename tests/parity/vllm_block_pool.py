"""Run with the vLLM reference venv's python (``tests/parity/test_block_pool.py`` does): minipaged's
``KVBlockManager`` and vLLM 0.33.0's own ``BlockPool`` driven in lockstep through random workloads (prompts
sharing documents, prefix-cache hits and revivals, decode growth, releases, evictions), compared after every
operation on every block table and on the whole free queue, in order. vLLM's ids are ours + 1 (its block 0 is
the null block). Prints one line; exits non-zero (an assertion naming seed and step) on the first difference."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from vllm.v1.core.block_pool import BlockPool

from minipaged_cli.memory import KVBlockManager, hash_blocks


def vllm_allocate(pool: BlockPool, hashes: list[bytes], num_tokens: int, block_size: int, caching: bool) -> list:
    """What vLLM's KVCacheManager does for a new request: the longest cached run (the last token always computed),
    touched, then new blocks from the front of the free queue, then its full blocks cached."""
    hits = []
    for block_hash in hashes[: (num_tokens - 1) // block_size] if caching else []:
        found = pool.get_cached_block(block_hash, [0])
        if found is None:
            break
        hits.append(found[0])
    pool.touch(hits)
    blocks = hits + pool.get_new_blocks(-(-num_tokens // block_size) - len(hits))
    if caching:
        pool.cache_full_blocks(SimpleNamespace(block_hashes=hashes), blocks, len(hits), num_tokens // block_size,
                               block_size, 0)
    return blocks


def run(seed: int, caching: bool) -> int:
    rng = random.Random(seed)
    num_blocks, block_size = rng.randint(4, 40), rng.choice([1, 2, 4])
    ours = KVBlockManager(num_blocks, block_size, enable_prefix_caching=caching)
    pool = BlockPool(num_blocks + 1, caching, hash_block_size=block_size)
    documents = {name: [(name, i) for i in range(rng.randint(1, 30))] for name in "abc"}
    live: dict[int, tuple[list, list[int]]] = {}  # sid -> (vLLM's blocks, [length])
    for step in range(60):
        sid, action = rng.randint(0, 6), rng.random()
        if sid not in live and action < 0.6:
            prompt = documents[rng.choice("abc")] + [("own", sid, step, i) for i in range(rng.randint(0, 8))]
            hashes = hash_blocks(tuple(prompt[i:i + block_size])
                                 for i in range(0, len(prompt) - block_size + 1, block_size))
            if ours.blocks_needed(None, len(prompt), hashes) > ours.num_free_blocks:
                continue
            ours.create_sequence(sid, len(prompt), block_hashes=hashes)
            blocks = vllm_allocate(pool, [h.to_bytes(16, "big") for h in hashes], len(prompt), block_size, caching)
            live[sid] = (blocks, [len(prompt)])
        elif sid in live and action < 0.8:
            blocks, length = live[sid]
            num_tokens = rng.randint(1, 5)
            needed = -(-(length[0] + num_tokens) // block_size) - len(blocks)
            if needed > ours.num_free_blocks:
                continue
            ours.grow(sid, num_tokens)
            blocks += pool.get_new_blocks(needed)
            length[0] += num_tokens
        elif sid in live:
            ours.release_sequence(sid)
            pool.free_blocks(reversed(live.pop(sid)[0]))
        for key, (blocks, _) in live.items():
            assert ours.sequences[key].block_table == [b.block_id - 1 for b in blocks], (seed, caching, step, key)
        theirs = [b.block_id - 1 for b in pool.free_block_queue.get_all_free_blocks()]
        assert list(ours.pool.free_blocks) == theirs, (seed, caching, step, list(ours.pool.free_blocks), theirs)
        assert ours.invariants_ok(), (seed, caching, step)
    return step + 1


if __name__ == "__main__":
    total = sum(run(seed, caching) for seed in range(300) for caching in (False, True))
    print(f"agreed with vLLM's BlockPool over {total} operations in 600 random workloads")
