"""Shared blocks: prefix caching, forks with copy-on-write, LRU eviction.

The property test keeps an independent model of the KV data itself: a dict from slot to the token written there.
Every token a sequence computes is written to its slot, every copy-on-write pair is applied, and a prefix-cache hit
writes nothing. After every operation each live sequence must read back, through its block table, exactly its
own tokens: a stale cache entry, a missing copy or a block handed out while still held all break that.
"""

from __future__ import annotations

import copy
import itertools

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from minipaged_cli.block_manager import (
    KVBlockManager,
    OutOfBlocksError,
    hash_blocks,
    token_block_contents,
)

SEQUENCE_IDS = st.integers(min_value=0, max_value=5)
DOCUMENTS = {name: [(name, i) for i in range(length)] for name, length in (("a", 12), ("b", 7), ("c", 20))}


def prompt_hashes(tokens: list, block_size: int) -> list[int]:
    return hash_blocks(token_block_contents(tokens, block_size))


def snapshot(manager: KVBlockManager) -> tuple:
    return (list(manager.free_blocks), copy.deepcopy(manager.sequences), list(manager.ref_counts),
            dict(manager.cached_blocks), list(manager.block_hash), list(manager.pending_copies))


class SharingMachine(RuleBasedStateMachine):
    @initialize(num_blocks=st.integers(2, 20), block_size=st.sampled_from([1, 2, 3, 4]))
    def setup(self, num_blocks: int, block_size: int) -> None:
        self.manager = KVBlockManager(num_blocks, block_size, enable_prefix_caching=True)
        self.block_size = block_size
        self.stream: dict[int, list] = {}  # each live sequence's tokens, written ones first, then its future
        self.length: dict[int, int] = {}
        self.store: dict[int, object] = {}  # the model of the KV data: slot -> token written there
        self.unique = itertools.count()

    def fresh(self, count: int) -> list:
        return [("own", next(self.unique)) for _ in range(count)]

    def write(self, sid: int, start: int, stop: int) -> None:
        """The data plane: copy-on-write copies first, then the new tokens' K/V into their slots."""
        for src, dst in self.manager.take_pending_copies():
            for offset in range(self.block_size):
                if src * self.block_size + offset in self.store:
                    self.store[dst * self.block_size + offset] = self.store[src * self.block_size + offset]
        table = self.manager.sequences[sid].block_table
        for pos in range(start, stop):
            self.store[table[pos // self.block_size] * self.block_size + pos % self.block_size] = self.stream[sid][pos]

    def expect_out_of_blocks(self, call, *args, **kwargs) -> None:
        before = snapshot(self.manager)
        with pytest.raises(OutOfBlocksError):
            call(*args, **kwargs)
        assert snapshot(self.manager) == before

    @rule(sid=SEQUENCE_IDS, document=st.sampled_from(sorted(DOCUMENTS)), own=st.integers(0, 6),
          future=st.integers(0, 12))
    def create_with_prompt(self, sid: int, document: str, own: int, future: int) -> None:
        if sid in self.stream:
            return
        prompt = DOCUMENTS[document] + self.fresh(own)
        tokens = prompt + self.fresh(future)
        hashes = prompt_hashes(tokens, self.block_size)
        if not self.manager.can_allocate(len(prompt), block_hashes=hashes):
            self.expect_out_of_blocks(self.manager.create_sequence, sid, len(prompt), block_hashes=hashes)
            return
        state = self.manager.create_sequence(sid, len(prompt), block_hashes=hashes)
        assert state.num_cached_tokens % self.block_size == 0
        assert state.num_cached_tokens <= len(prompt) - 1  # the last prompt token is always computed
        self.stream[sid], self.length[sid] = tokens, len(prompt)
        self.write(sid, state.num_cached_tokens, len(prompt))  # cached tokens are already in their slots

    @rule(sid=SEQUENCE_IDS, num_tokens=st.integers(1, 6))
    def append(self, sid: int, num_tokens: int) -> None:
        if sid not in self.stream:
            return
        start = self.length[sid]
        if len(self.stream[sid]) < start + num_tokens:
            self.stream[sid] += self.fresh(start + num_tokens - len(self.stream[sid]))
        if not self.manager.can_allocate(num_tokens, sid):
            self.expect_out_of_blocks(self.manager.append_tokens, sid, num_tokens)
            return
        self.manager.append_tokens(sid, num_tokens)
        self.length[sid] = start + num_tokens
        self.write(sid, start, start + num_tokens)

    @rule(parent=SEQUENCE_IDS, child=SEQUENCE_IDS, future=st.integers(0, 10))
    def fork(self, parent: int, child: int, future: int) -> None:
        if parent not in self.stream or child in self.stream:
            return
        tokens = self.stream[parent][: self.length[parent]] + self.fresh(future)
        self.manager.fork(parent, child, block_hashes=prompt_hashes(tokens, self.block_size))
        self.stream[child], self.length[child] = tokens, self.length[parent]

    @rule(sid=SEQUENCE_IDS)
    def release(self, sid: int) -> None:
        if sid in self.stream:
            self.manager.release_sequence(sid)
            del self.stream[sid], self.length[sid]

    @precondition(lambda self: hasattr(self, "manager"))
    @invariant()
    def every_sequence_reads_back_its_own_tokens(self) -> None:
        assert self.manager.invariant_violations() == []
        for sid, length in self.length.items():
            table = self.manager.sequences[sid].block_table
            read = [self.store.get(table[p // self.block_size] * self.block_size + p % self.block_size)
                    for p in range(length)]
            assert read == self.stream[sid][:length], f"sequence {sid} reads another sequence's K/V"
        held = {b for s in self.manager.sequences.values() for b in s.block_table}
        assert self.manager.num_used_blocks == len(held)  # shared blocks count once


TestSharingMachine = SharingMachine.TestCase
TestSharingMachine.settings = settings(max_examples=200, stateful_step_count=40, deadline=None)


def test_a_hit_shares_blocks_and_counts_them_once() -> None:
    manager = KVBlockManager(8, 4, enable_prefix_caching=True)
    prompt = list(range(10))  # blocks [0..3], [4..7] full, then 2 tokens
    hashes = prompt_hashes(prompt, 4)
    first = manager.create_sequence("a", 10, block_hashes=hashes)
    second = manager.create_sequence("b", 10, block_hashes=hashes)
    assert second.num_cached_tokens == 8 and second.block_table[:2] == first.block_table[:2]
    assert second.block_table[2] != first.block_table[2]  # the partial block is each one's own
    assert manager.num_used_blocks == 4  # 2 shared + 2 own, not 6
    assert [manager.ref_counts[b] for b in first.block_table] == [2, 2, 1]
    manager.release_sequence("a")
    manager.release_sequence("b")
    # SGLang 35270: evictable pages are counted once, not once per sequence that held them.
    assert manager.num_evictable_blocks == 2 and manager.num_free_blocks == 8


def test_a_full_hit_at_a_block_multiple_still_computes_the_last_token() -> None:
    # nano-vllm 144: an 8-token prompt at block size 4 fully cached must still compute token 7.
    manager = KVBlockManager(8, 4, enable_prefix_caching=True)
    hashes = prompt_hashes(list(range(8)), 4)
    manager.create_sequence("a", 8, block_hashes=hashes)
    manager.release_sequence("a")
    again = manager.create_sequence("b", 8, block_hashes=hashes)
    assert again.num_cached_tokens == 4
    assert again.sequence_length == 8 and len(again.block_table) == 2
    assert manager.invariants_ok()


def test_no_hit_on_a_block_whose_content_changed() -> None:
    # nano-vllm 163: a freed cached block handed out again must lose its hash entry.
    manager = KVBlockManager(3, 4, enable_prefix_caching=True)
    hashes = prompt_hashes(list(range(9)), 4)
    manager.create_sequence("a", 9, block_hashes=hashes)
    manager.release_sequence("a")
    other = prompt_hashes([100 + t for t in range(12)], 4)
    manager.create_sequence("b", 12, block_hashes=other)  # takes all three blocks, evicting a's two cached ones
    assert manager.num_evictions == 2
    assert all(h not in manager.cached_blocks for h in hashes)
    assert manager.num_cached_tokens(9, hashes) == 0
    assert manager.invariants_ok()


def test_eviction_takes_the_least_recently_freed_and_the_tail_of_a_chain_first() -> None:
    manager = KVBlockManager(6, 2, enable_prefix_caching=True)
    a = prompt_hashes(list(range(5)), 2)  # two full blocks + one token
    b = prompt_hashes(list(range(50, 55)), 2)
    blocks_a = list(manager.create_sequence("a", 5, block_hashes=a).block_table)
    blocks_b = list(manager.create_sequence("b", 5, block_hashes=b).block_table)
    manager.release_sequence("a")
    manager.release_sequence("b")
    assert list(manager.free_blocks) == blocks_a[::-1] + blocks_b[::-1]
    manager.create_sequence("c", 2)  # one block: a's uncached partial block goes first
    manager.create_sequence("d", 2)  # then a's tail block: a keeps its head block cached
    assert manager.num_cached_tokens(5, a) == 2 and manager.num_cached_tokens(5, b) == 4


def test_a_hit_on_a_freed_block_revives_it() -> None:
    manager = KVBlockManager(3, 4, enable_prefix_caching=True)
    hashes = prompt_hashes(list(range(9)), 4)
    manager.create_sequence("a", 9, block_hashes=hashes)
    manager.release_sequence("a")
    # 3 blocks for 9 tokens: 2 revived from the free queue, 1 fresh; all 3 come out of the 3 free blocks.
    assert manager.blocks_needed(None, 9, hashes) == 3
    state = manager.create_sequence("b", 9, block_hashes=hashes)
    assert state.num_cached_tokens == 8 and manager.num_free_blocks == 0 and manager.num_evictions == 0


def test_fork_copies_a_shared_partial_block_on_first_write() -> None:
    manager = KVBlockManager(8, 4)
    manager.create_sequence("p")
    manager.append_tokens("p", 6)  # blocks 0 (full) and 1 (2 of 4)
    child = manager.fork("p", "c")
    assert child.block_table == [0, 1] and manager.ref_counts[:2] == [2, 2]
    assert manager.num_used_blocks == 2
    slot = manager.append_token("c")  # writes into shared block 1: copy it to block 2 first
    assert manager.take_pending_copies() == [(1, 2)]
    assert child.block_table == [0, 2] and slot == 2 * 4 + 2
    manager.append_token("p")  # block 1 is the parent's alone now: no copy
    assert manager.take_pending_copies() == [] and manager.sequences["p"].block_table == [0, 1]
    assert manager.num_copy_on_writes == 1 and manager.invariants_ok()


def test_copy_on_write_counts_its_block_before_changing_anything() -> None:
    manager = KVBlockManager(2, 4)
    manager.create_sequence("p")
    manager.append_tokens("p", 6)
    manager.fork("p", "c")
    before = snapshot(manager)
    assert manager.blocks_needed("c", 1) == 1 and not manager.can_allocate(1, "c")
    with pytest.raises(OutOfBlocksError):
        manager.append_token("c")
    assert snapshot(manager) == before


def test_without_prefix_caching_nothing_is_shared_by_content() -> None:
    manager = KVBlockManager(8, 4)
    hashes = prompt_hashes(list(range(9)), 4)
    manager.create_sequence("a", 9, block_hashes=hashes)
    assert manager.create_sequence("b", 9, block_hashes=hashes).num_cached_tokens == 0
    assert manager.cached_blocks == {} and manager.num_used_blocks == 6
