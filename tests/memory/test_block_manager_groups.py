"""The block manager under KV cache groups (``memory/block_manager.py`` over ``coordinator.py`` and
``single_type.py``) and the grouping (``memory/kv_groups.py``).

Random operation sequences run against a naive model that only counts: a sequence of L tokens, C of them computed
when its windows last slid, holds ceil(L / B) blocks in a full-attention group and ceil(L / B) - max(0, C - W + 1)
// B in a sliding one; the pool's free blocks are what no group holds. The manager must agree on every count,
keep every invariant after every step, and leave the state exactly as before when a call fails (a failed
``grow`` keeps only the slide that precedes its allocation, as vLLM's ``allocate_slots`` does). The per-group
block ids, free-queue order and hits are checked against vLLM itself in ``tests/parity/test_hybrid.py``.
"""

from __future__ import annotations

import copy

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from minipaged_cli.memory import OutOfBlocksError, hash_blocks
from minipaged_cli.memory.block_manager import KVBlockManager
from minipaged_cli.memory.kv_groups import KVCacheGroup, block_bytes, kv_cache_groups
from minipaged_cli.memory.sequence import NULL_BLOCK
from minipaged_cli.workloads.presets import FULL_ATTENTION, SLIDING_ATTENTION, ModelSpec

SEQUENCE_IDS = st.integers(min_value=0, max_value=5)
LAYOUTS = ((SLIDING_ATTENTION, FULL_ATTENTION), (FULL_ATTENTION, SLIDING_ATTENTION, SLIDING_ATTENTION),
           (SLIDING_ATTENTION,))


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


class HybridManagerMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(1, 40), block_size=st.sampled_from([1, 2, 4]), window=st.integers(1, 10),
                layout=st.sampled_from(LAYOUTS), caching=st.booleans())
    def setup(self, num_blocks: int, block_size: int, window: int, layout: tuple[str, ...], caching: bool) -> None:
        groups = [KVCacheGroup(kind, (i,), 1, window if kind == SLIDING_ATTENTION else None)
                  for i, kind in enumerate(layout)]
        self.manager = KVBlockManager(num_blocks, block_size, groups, enable_prefix_caching=caching)
        self.num_blocks, self.block_size, self.window, self.layout = num_blocks, block_size, window, layout
        self.caching = caching
        self.lengths: dict[int, int] = {}  # the model: every live sequence's length ...
        self.slid_at: dict[int, int] = {}  # ... and its computed tokens when its windows last slid
        self.hashes = hash_blocks(("shared", i) for i in range(40))  # every sequence has the same content

    def held(self, sid: int) -> list[int]:
        """Blocks the model says each group holds."""
        length, slid = self.lengths[sid], self.slid_at[sid]
        skipped = min(max(0, slid - self.window + 1) // self.block_size, cdiv(length, self.block_size))
        return [cdiv(length, self.block_size) - (skipped if kind == SLIDING_ATTENTION else 0) for kind in self.layout]

    def snapshot(self) -> tuple:
        return list(self.manager.pool.free_blocks), copy.deepcopy(self.manager.sequences), \
            copy.deepcopy(self.manager.pool.cached_blocks)

    @rule(sid=SEQUENCE_IDS, length=st.integers(0, 30))
    def create(self, sid: int, length: int) -> None:
        if sid in self.lengths:
            return
        before = self.snapshot()
        try:
            state = self.manager.create_sequence(sid, length, block_hashes=self.hashes if self.caching else ())
        except OutOfBlocksError:
            assert self.snapshot() == before
            return
        self.lengths[sid] = length
        self.slid_at[sid] = state.num_cached_tokens  # a hit's out-of-window blocks enter as null blocks

    @precondition(lambda self: self.lengths)
    @rule(data=st.data(), num_tokens=st.integers(0, 9))
    def grow(self, data: st.DataObject, num_tokens: int) -> None:
        sid = data.draw(st.sampled_from(sorted(self.lengths)))
        self.manager.slide_window(sid)  # what grow does first, success or not
        self.slid_at[sid] = self.lengths[sid]
        before = self.snapshot()
        try:
            self.manager.grow(sid, num_tokens)
        except OutOfBlocksError:
            assert self.snapshot() == before
            return
        self.lengths[sid] += num_tokens

    @precondition(lambda self: self.lengths)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        sid = data.draw(st.sampled_from(sorted(self.lengths)))
        self.manager.release_sequence(sid)
        del self.lengths[sid], self.slid_at[sid]

    @invariant()
    def agrees_with_the_model(self) -> None:
        if not hasattr(self, "manager"):
            return
        assert self.manager.invariant_violations() == []
        for sid in self.lengths:
            state = self.manager.sequences[sid]
            held = [len(table) - table.count(NULL_BLOCK) for table in state.block_tables]
            if not self.caching:  # (a hit's null blocks depend on the cache; the counts are checked without it)
                assert held == self.held(sid)
            assert self.manager.num_held_blocks(sid) == sum(held)
        if not self.caching:
            assert self.manager.num_free_blocks == self.num_blocks - sum(sum(self.held(s)) for s in self.lengths)


TestHybridManager = HybridManagerMachine.TestCase
TestHybridManager.settings = settings(max_examples=150, stateful_step_count=30, deadline=None)


def test_a_worked_window_frees_the_blocks_the_next_token_cannot_see() -> None:
    # block size 4, window 8: with 14 tokens computed the next token (14) sees tokens 7..14, so block 0 (tokens
    # 0..3) goes, block 1 (4..7) stays: max(0, 14 - 8 + 1) // 4 = 1 (the module docstring's diagram)
    groups = [KVCacheGroup(FULL_ATTENTION, (0,), 1), KVCacheGroup(SLIDING_ATTENTION, (1,), 1, 8)]
    manager = KVBlockManager(10, 4, groups)
    manager.create_sequence("s", 14)
    assert manager.sequences["s"].block_tables == [[0, 1, 2, 3], [4, 5, 6, 7]]
    manager.grow("s", 1)  # slides with 14 computed, then takes no block (15 tokens fit in 4)
    assert manager.sequences["s"].block_tables == [[0, 1, 2, 3], [NULL_BLOCK, 5, 6, 7]]
    assert list(manager.pool.free_blocks)[:1] == [4]  # the freed block is reused first
    manager.release_sequence("s")
    assert manager.num_free_blocks == 10


def test_a_hit_keeps_the_window_and_nulls_the_rest() -> None:
    # block size 2, window 5: a hit needs the last ceil(4 / 2) = 2 cached blocks of the sliding group; the full
    # group hits from the left
    groups = [KVCacheGroup(FULL_ATTENTION, (0,), 1), KVCacheGroup(SLIDING_ATTENTION, (1,), 1, 5)]
    manager = KVBlockManager(40, 2, groups, enable_prefix_caching=True)
    hashes = hash_blocks(("doc", i) for i in range(10))
    manager.create_sequence("a", 20, block_hashes=hashes)  # 10 blocks per group, all cached
    assert manager.num_cached_tokens(13, hashes) == 12  # (13 - 1) // 2 = 6 blocks may hit
    manager.create_sequence("b", 13, block_hashes=hashes)
    full, sliding = manager.sequences["b"].block_tables
    assert full[:6] == manager.sequences["a"].block_tables[0][:6]
    # 12 tokens hit: max(0, 12 - 5 + 1) // 2 = 4 blocks skipped; blocks 4, 5 shared; block 6 new
    assert sliding[:4] == [NULL_BLOCK] * 4 and sliding[4:6] == manager.sequences["a"].block_tables[1][4:6]
    assert manager.invariant_violations() == []


def test_a_sliding_hit_ends_where_its_window_is_cached() -> None:
    # block size 2, window 5 (a hit needs 2 contiguous cached sliding blocks), a pool of exactly 21 blocks
    groups = [KVCacheGroup(FULL_ATTENTION, (0,), 1), KVCacheGroup(SLIDING_ATTENTION, (1,), 1, 5)]
    manager = KVBlockManager(21, 2, groups, enable_prefix_caching=True)
    hashes = hash_blocks(("doc", i) for i in range(11))
    manager.create_sequence("a", 20, block_hashes=hashes)  # 10 blocks a group, all cached; 1 block free
    # grow slides first: max(0, 20 - 5 + 1) // 2 = 8 sliding blocks freed, last first, to the back of the queue
    # (still cached); then 2 blocks taken: the untouched one and the least recently freed, sliding block 7
    manager.grow("a", 1)
    assert manager.num_free_blocks == 7
    # 19 tokens: full attention hits blocks 0..8; the window from the right: 8 held, 7 evicted, then 6 and 5
    # cached -> the hit ends after block 6: 14 tokens
    assert manager.num_cached_tokens(19, hashes) == 14
    assert manager.num_cached_tokens(13, hashes) == 12  # blocks 4 and 5 end the window: all 6 candidates hit


@pytest.mark.parametrize(("name", "layer_types", "window", "expected"), [
    # gpt-oss-20b: 24 layers alternating, sliding first -> 12 + 12: group size 12, (sliding, full)
    ("gpt-oss-20b", tuple(SLIDING_ATTENTION if i % 2 == 0 else FULL_ATTENTION for i in range(24)), 128,
     [(SLIDING_ATTENTION, 12, 12), (FULL_ATTENTION, 12, 12)]),
    # gemma-3-27b: every 6th of 62 layers global -> 52 sliding + 10 full: group size 10, six sliding groups
    # (layers[i::6]: 9, 9, 9, 9, 8, 8 layers, padded to 10) and one full
    ("gemma-3-27b", tuple(FULL_ATTENTION if (i + 1) % 6 == 0 else SLIDING_ATTENTION for i in range(62)), 1024,
     [(SLIDING_ATTENTION, 9, 10)] * 4 + [(SLIDING_ATTENTION, 8, 10)] * 2 + [(FULL_ATTENTION, 10, 10)]),
    # 12 sliding + 13 full (gpt-oss + a drafter layer): 13 < 12 * 1.5, so group size 13, the sliding group padded
    ("drafter", (SLIDING_ATTENTION,) * 12 + (FULL_ATTENTION,) * 13, 128,
     [(SLIDING_ATTENTION, 12, 13), (FULL_ATTENTION, 13, 13)]),
])
def test_groups_as_vllm_forms_them(name: str, layer_types: tuple[str, ...], window: int,
                                   expected: list[tuple[str, int, int]]) -> None:
    model = ModelSpec(name=name, num_layers=len(layer_types), hidden_size=64, intermediate_size=64, num_q_heads=8,
                      num_kv_heads=8, head_dim=64, vocab_size=100, tie_word_embeddings=False, gated_mlp=True,
                      dtype="bfloat16", max_model_len=4096, layer_types=layer_types, sliding_window=window)
    groups = kv_cache_groups(model)
    assert [(g.kind, len(g.layer_indices), g.num_layers) for g in groups] == expected
    assert sorted(i for g in groups for i in g.layer_indices) == list(range(len(layer_types)))
    assert all(layer_types[i] == g.kind for g in groups for i in g.layer_indices)
    # a block of any group: group size x one layer's page (K and V, 8 heads x 64, 2 bytes) x block size 16
    assert block_bytes(model, groups, 16) == expected[0][2] * 16 * 2 * 8 * 64 * 2
    assert [g.kind for g in kv_cache_groups(model, hybrid=False)] == [FULL_ATTENTION]


def test_content_keys_that_repeat_in_a_prompt_cache_the_first_block_and_keep_the_rest_as_duplicates() -> None:
    # Caching takes a prompt's keys for distinct (content keys are chained hashes) and enters them in one pass;
    # keys that do repeat must still be cached as one at a time caches them: the first block holds the entry,
    # the later ones wait as duplicates, in every group.
    groups = [KVCacheGroup(FULL_ATTENTION, (0,), 1), KVCacheGroup(SLIDING_ATTENTION, (1,), 1, 8)]
    manager = KVBlockManager(20, 4, groups, enable_prefix_caching=True)
    state = manager.create_sequence("s", 12, block_hashes=[7, 7, 8])
    pool = manager.pool
    for g, table in enumerate(state.block_tables):
        assert pool.cached_blocks[g] == {7: table[0], 8: table[2]}
        assert pool.duplicate_blocks[g] == {7: [table[1]]}
    assert manager.invariant_violations() == []


def test_a_model_with_several_groups_forks_no_sequence() -> None:
    # vLLM runs parallel samples under KV cache groups as separate requests: a fork would share blocks that a
    # window frees, so the manager refuses it and changes nothing.
    groups = [KVCacheGroup(SLIDING_ATTENTION, (0,), 1, 8), KVCacheGroup(FULL_ATTENTION, (1,), 1, None)]
    manager = KVBlockManager(20, 4, groups)
    manager.create_sequence(0, 10)
    with pytest.raises(ValueError, match="forks no sequence"):
        manager.fork(0, 1)
    assert list(manager.sequences) == [0] and manager.invariant_violations() == []
