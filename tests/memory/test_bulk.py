"""The paged strategy's fast paths against the step-by-step model they stand in for, by property tests: the hit
memo (``HitsMemo``) against ``search_hits`` and, for a waiting head asked again, against its map read key by key,
``BlockPool.cache_fresh`` against ``cache``, a bulk decode (``bulk.advance_windowed``, through ``decode_in_bulk`` or
in lockstep) against one ``grow`` per request and step, ``bulk.full_attention_profile`` against a count per request
and step (handed each request's allocations or their sum, ``PagedAllocator.bulk_allocations``, which is
checked against ``allocated`` asked of each), and ``num_blocks_to_allocate`` against a count per block.
(``BlockPool.release_split``: ``tests/memory/test_block_pool_release.py``; ``bulk.windowed_profile``:
``tests/memory/test_bulk_decode.py``.)"""

from __future__ import annotations

import copy
import random

import numpy as np
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from minipaged_cli.memory.allocators import Holding
from minipaged_cli.memory.block_manager import KVBlockManager
from minipaged_cli.memory.block_pool import BlockPool
from minipaged_cli.memory.bulk import advance_windowed, full_attention_profile
from minipaged_cli.memory.kv_groups import KVCacheGroup
from minipaged_cli.memory.paged import PagedAllocator
from minipaged_cli.memory.prefix import hash_blocks
from minipaged_cli.memory.sequence import NULL_BLOCK
from minipaged_cli.memory.single_type import SingleTypeManager
from minipaged_cli.workloads.presets import FULL_ATTENTION, SLIDING_ATTENTION
from tests.memory.conftest import LOOP_KINDS
from tests.memory.test_bulk_decode import scenario, state

pytestmark = LOOP_KINDS  # (each test with the Python loops, then the compiled ones)


def prompts_sharing_documents(rng: random.Random) -> list[list[int]]:
    """Six prompts' block keys: up to 6 blocks of one of 3 shared documents, then 8 blocks of the prompt's own."""
    return [hash_blocks([("doc", d, i) for i in range(rng.randint(0, 6))] + [("own", p, i) for i in range(8)])
            for p, d in enumerate(rng.choices(range(3), k=6))]

LAYOUTS = ((FULL_ATTENTION,), (SLIDING_ATTENTION, FULL_ATTENTION), (FULL_ATTENTION, FULL_ATTENTION),
           (SLIDING_ATTENTION,))


def random_groups(rng: random.Random, layout: tuple[str, ...]) -> tuple[int, list[KVCacheGroup]]:
    """A block size of 1, 2 or 4 and one KV cache group per kind in ``layout``, sliding ones over a window of 1 to
    12 tokens."""
    block_size, window = rng.choice([1, 2, 4]), rng.randint(1, 12)
    return block_size, [KVCacheGroup(kind, (i,), 1, window if kind == SLIDING_ATTENTION else None)
                        for i, kind in enumerate(layout)]


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10**6), layout=st.sampled_from(LAYOUTS))
def test_the_hit_memo_answers_as_the_search(seed: int, layout: tuple[str, ...]) -> None:
    # Prompts share documents; after every create, decode and release (each may cache or evict blocks, moving the
    # cache version) the memoised answer for every prompt and length is the search's, asked fresh.
    rng = random.Random(seed)
    block_size, groups = random_groups(rng, layout)
    manager = KVBlockManager(rng.randint(8, 60), block_size, groups, enable_prefix_caching=True)
    prompts = prompts_sharing_documents(rng)
    live: list[int] = []
    for step in range(30):
        sid = rng.randrange(len(prompts))
        length = rng.randint(1, 10 * block_size)
        if sid not in live and manager.blocks_to_create(length, prompts[sid]) <= manager.num_free_blocks:
            manager.create_sequence(sid, length, block_hashes=prompts[sid])
            live.append(sid)
        elif sid in live and rng.random() < 0.5:
            manager.release_sequence(sid)
            live.remove(sid)
        elif sid in live and manager.blocks_needed(sid, 1) <= manager.num_free_blocks:
            manager.grow(sid, 1)
        for hashes in rng.sample(prompts, 3):
            for num_tokens in (rng.randint(0, 10 * block_size), len(hashes) * block_size):
                assert manager.find_hits(hashes, num_tokens) == manager.search_hits(hashes, num_tokens), step


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10**6), layout=st.sampled_from(LAYOUTS))
def test_the_hit_memo_follows_a_prompt_changed_in_place(seed: int, layout: tuple[str, ...]) -> None:
    # The memo keeps a copy of only the keys its searches read: a prompt's list changed in place between two asks
    # (a key replaced by another prompt's or a new one, a key appended, one dropped), or another list sharing its
    # first keys, is answered as a fresh search answers it, at the same cache version.
    rng = random.Random(seed)
    block_size, groups = random_groups(rng, layout)
    manager = KVBlockManager(60 * len(groups), block_size, groups, enable_prefix_caching=True)
    prompts = prompts_sharing_documents(rng)
    for sid, hashes in enumerate(prompts):
        length = rng.randint(1, len(hashes) * block_size)
        if manager.blocks_to_create(length, hashes) <= manager.num_free_blocks:
            manager.create_sequence(sid, length, block_hashes=hashes)
            if rng.random() < 0.5:
                manager.release_sequence(sid)
    asked = list(rng.choice(prompts))
    for _ in range(40):
        change = rng.randrange(4)
        if change == 0 and asked:
            asked[rng.randrange(len(asked))] = rng.choice([*rng.choice(prompts), ("new", rng.random())])
        elif change == 1:
            asked.append(rng.choice(rng.choice(prompts)))
        elif change == 2 and asked:
            del asked[rng.randrange(len(asked))]
        else:
            kept = rng.randint(0, len(asked))
            asked = asked[:kept] + rng.choice(prompts)[kept:]
        for num_tokens in (rng.randint(0, 16 * block_size), len(asked) * block_size):
            assert manager.find_hits(asked, num_tokens) == manager.search_hits(list(asked), num_tokens)


def naive_hits(manager: KVBlockManager, hashes: list[int], num_tokens: int) -> list[int]:
    """One group's hit read off its map key by key: the cached run from the start, the last token never a hit."""
    hits = []
    for key in hashes[:max(num_tokens - 1, 0) // manager.block_size]:
        if key not in manager.pool.cached_blocks[0]:
            break
        hits.append(manager.pool.cached_blocks[0][key])
    return hits


@settings(max_examples=150, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_a_waiting_head_is_answered_as_the_cache_now_stands(seed: int) -> None:
    # One prompt (the waiting head) asked at two fixed lengths after every one to three changes of a small pool by
    # other prompts sharing its documents: created whole or in chunks (two computing one content cache it twice),
    # released, grown. Its hit blocks are evicted, their content cached again elsewhere, an entry passes to a
    # duplicate, the key past its hit is cached: the memo's answer found at an older version, where it is
    # checked rather than searched, must be the one read off the map now, and the gate's count with it.
    rng = random.Random(seed)
    block_size = rng.choice([1, 2, 4])
    manager = KVBlockManager(rng.randint(6, 24), block_size, enable_prefix_caching=True)
    prompts = prompts_sharing_documents(rng)
    head, live = prompts[0], {}
    lengths = (len(head) * block_size, rng.randint(1, len(head) * block_size))
    for step in range(60):
        for _ in range(rng.randint(1, 3)):  # (a step: a release and a take between two asks, say)
            sid = rng.randrange(1, len(prompts) + 3)
            hashes = prompts[sid % len(prompts)]
            if sid not in live:
                length = rng.randint(1, len(hashes) * block_size)
                computed = rng.choice([length, rng.randint(0, length)])
                if manager.blocks_to_create(length, hashes) <= manager.num_free_blocks:
                    manager.create_sequence(sid, length, block_hashes=hashes, num_computed_tokens=computed)
                    live[sid] = length
            elif rng.random() < 0.4:
                manager.release_sequence(sid)
                del live[sid]
            elif manager.sequence(sid).num_computed_tokens < live[sid]:
                manager.mark_computed(sid, live[sid])
            elif manager.blocks_needed(sid, 1) <= manager.num_free_blocks:
                manager.grow(sid, 1)
                live[sid] += 1
        for num_tokens in lengths:
            hits = naive_hits(manager, head, num_tokens) if num_tokens > block_size else []
            assert manager.find_hits(head, num_tokens) == ([hits], len(hits) * block_size), step
            free_hits = sum(1 for block in hits if manager.pool.ref_counts[block] == 0)
            needed = max(-(-num_tokens // block_size) - len(hits), 0) + free_hits
            assert manager.blocks_needed(None, num_tokens, head) == needed, step


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_cache_fresh_enters_keyless_blocks_as_cache_does(seed: int) -> None:
    # Keyless blocks under keys new, cached already (in the group or another), or repeated: both pools end alike.
    rng = random.Random(seed)
    fresh, reference = BlockPool(24, num_groups=2, enable_caching=True), BlockPool(24, num_groups=2,
                                                                                  enable_caching=True)
    table: list[int] = []
    fresh.take(24, table)
    reference.take(24, [])
    rng.shuffle(table)
    while table:
        blocks, table = table[:rng.randint(1, 5)], table[5:]
        keys, group = [rng.randrange(8) for _ in blocks], rng.randrange(2)
        fresh.cache_fresh(keys, blocks, group)
        reference.cache(keys, blocks, group)
        assert (fresh.cached_blocks, fresh.duplicate_blocks, fresh.block_hash, fresh.block_group,
                fresh.cache_version) == (reference.cached_blocks, reference.duplicate_blocks, reference.block_hash,
                                         reference.block_group, reference.cache_version)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_a_bulk_decode_leaves_the_pool_as_single_steps(seed: int) -> None:
    bulk, running, num_steps = scenario(seed)
    single = copy.deepcopy(bulk)
    for _ in range(num_steps):
        for sid in running:
            assume(single.blocks_needed(sid, 1) <= single.num_free_blocks)  # (else the replay stops before)
            single.grow(sid, 1)
    advance_windowed(bulk, running, num_steps)
    assert state(bulk) == state(single)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_the_full_attention_profile_counts_each_request_and_step(seed: int) -> None:
    # During step j a request of length L holds ceil((L + j) / B) blocks; the profile stops before the first step
    # whose new blocks exceed the free ones; internal slots are those past each request's final length.
    rng = random.Random(seed)
    block_size, num_free = rng.choice([1, 4, 16]), rng.randint(0, 30)
    lengths = [rng.randint(1, 100) for _ in range(rng.randint(1, 6))]
    finals = [length + rng.randint(0, 40) for length in lengths]
    num_steps = rng.randint(1, 40)
    held = [sum(-(-(length + j) // block_size) for length in lengths) for j in range(num_steps + 1)]
    num_ok = next((j - 1 for j in range(1, num_steps + 1) if held[j] - held[0] > num_free), num_steps)
    allocated = np.array([-(-length // block_size) * block_size for length in lengths], dtype=np.int64)
    profile = full_attention_profile(block_size, num_free, np.array(lengths, dtype=np.int64), allocated,
                                     np.array(finals, dtype=np.int64), num_steps)
    assert profile.num_steps == num_ok
    assert list(profile.allocated) == [held[j] * block_size for j in range(1, num_ok + 1)]
    assert list(profile.internal) == [sum(max(-(-(length + j) // block_size) * block_size - final, 0)
                                          for length, final in zip(lengths, finals, strict=True))
                                      for j in range(1, num_ok + 1)]
    # Handed the allocations' sum (``PagedAllocator.bulk_allocations``), the profile is the same
    summed = full_attention_profile(block_size, num_free, np.array(lengths, dtype=np.int64), int(allocated.sum()),
                                    np.array(finals, dtype=np.int64), num_steps)
    assert summed.num_steps == num_ok
    assert list(summed.allocated) == list(profile.allocated) and list(summed.internal) == list(profile.internal)


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 10**6), prefix_caching=st.booleans())
def test_the_paged_bulk_allocations_are_the_sum_over_the_requests(seed: int, prefix_caching: bool) -> None:
    # What a bulk reads of the running requests' allocations is their sum, counted by the pool, after every
    # admission (sharing cached blocks), growth and release: the reference is ``allocated`` asked of each.
    rng = random.Random(seed)
    block_size = rng.choice([1, 4, 16])
    allocator = PagedAllocator(rng.randint(8, 60), block_size, prefix_caching=prefix_caching)
    running: list[Holding] = []
    for sequence_id in range(30):
        action = rng.random()
        if action < 0.4 or not running:
            prompt = rng.randint(1, 40)
            keys = hash_blocks([("doc", rng.randint(0, 2), i) for i in range(prompt // block_size)])
            holding = Holding(sequence_id, prompt, rng.randint(1, 20), keys if prefix_caching else [])
            if allocator.can_admit(holding, prompt):
                allocator.admit(holding, prompt)
                running.append(holding)
        elif action < 0.8:
            holding = rng.choice(running)
            length = allocator.manager.sequences[holding.sequence_id].sequence_length
            allocator.try_grow(holding, length, length + rng.randint(1, 5))
        else:
            allocator.release(running.pop(rng.randrange(len(running))))
        assert allocator.bulk_allocations(running) == sum(allocator.allocated(holding) for holding in running)


@settings(max_examples=200, deadline=None)
@given(ref_counts=st.lists(st.integers(0, 3), min_size=1, max_size=12), data=st.data())
def test_blocks_to_allocate_count_each_new_block_and_each_revived_hit(ref_counts: list[int],
                                                                      data: st.DataObject) -> None:
    # Each required block past the hit and the skipped blocks is new; each hit past the skipped ones on a block no
    # table holds (count 0) comes back from the free queue; a null entry (a sliding group's) takes nothing.
    hits = data.draw(st.lists(st.sampled_from([NULL_BLOCK, *range(len(ref_counts))]), max_size=10))
    num_skipped, num_required = data.draw(st.integers(0, 12)), data.draw(st.integers(0, 20))
    new = sum(1 for position in range(num_required) if position >= len(hits) and position >= num_skipped)
    revived = sum(1 for position, block in enumerate(hits)
                  if position >= num_skipped and block != NULL_BLOCK and ref_counts[block] == 0)
    assert SingleTypeManager.num_blocks_to_allocate(hits, num_required, num_skipped, ref_counts) == new + revived
