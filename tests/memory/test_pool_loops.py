"""The memory plane's compiled loops (``memory/pool_loops.c``) against their Python reference
(``memory/pool_loops.py``): on random pools (reference counts, the key each block carries, a cache map whose
entries agree with them, block ids past CPython's cached small ints) and random calls, the same result, the same
lists and the same map, its entries' order included; on a broken pool (a key with no entry, a block id past the
lists) the same error, the lists left as the Python loop leaves them at the same block; on random decoding
sequences (some reserved ahead, loading or unknown) the same growth, takes, fills and lengths, and the same keys,
tables and counts from the passes after it. Which
implementation a pool gets: ``loops()`` and ``MINIPAGED_NATIVE``. (The compiled bulk profile is checked in
``test_bulk.py``.)"""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged_cli import native_build
from minipaged_cli.memory import pool_loops
from minipaged_cli.memory.block_pool import BlockPool
from minipaged_cli.memory.pool_loops import PRIVATE
from minipaged_cli.memory.sequence import SequenceState
from tests.memory.conftest import compiled_loops


def fresh(value: int) -> int:
    """``value`` as an int object of its own (an id past 256 is one in a real pool: the cached small ints aside,
    equal ids need not be the same object)."""
    return int(str(value))


def random_state(rng: random.Random) -> tuple[list[int], list, dict]:
    """refs, hashes, cached: each block carries a distinct key (ints and tuples), ``PRIVATE`` or none, and ``cached``
    maps each carried key but ``PRIVATE`` to its block, in a random order; sometimes broken (a carried key missing
    from the map, keys mapped to blocks that do not carry them)."""
    num_blocks = rng.choice([rng.randint(1, 12), rng.randint(250, 300)])
    refs = [rng.choice([0, 1, 1, 2, 3]) for _ in range(num_blocks)]
    keys = rng.sample([*range(40), *((i, "k") for i in range(20))], 60)
    hashes: list = [keys.pop() if keys and rng.random() < 0.5 else None for _ in range(num_blocks)]
    hashes = [PRIVATE if key is not None and rng.random() < 0.2 else key for key in hashes]
    carriers = [block for block, key in enumerate(hashes) if key is not None and key is not PRIVATE]
    rng.shuffle(carriers)
    cached = {hashes[block]: fresh(block) for block in carriers}
    if carriers and rng.random() < 0.05:
        del cached[hashes[rng.choice(carriers)]]
    if rng.random() < 0.1:  # a key cached by a block that does not carry it
        cached.update((key, fresh(rng.randrange(num_blocks))) for key in rng.sample(range(40), 5) if key not in cached)
    return refs, hashes, cached


def random_blocks(rng: random.Random, num_blocks: int, count: int) -> list[int]:
    """``count`` distinct block ids (fresh objects; a table holds a block once), or as many as the pool has; now
    and then one past the pool."""
    blocks = [fresh(block) for block in rng.sample(range(num_blocks), min(count, num_blocks))]
    count = len(blocks)
    if blocks and rng.random() < 0.05:
        blocks[rng.randrange(count)] = num_blocks + rng.randint(0, 3)
    return blocks


def run_both(call: str, state: tuple, *args: object) -> None:
    """``call`` of each implementation on its own copy of ``state`` (refs, hashes, cached; the first may be None)
    and ``args``: the same result or error, and the same state after, the map's order included."""
    outcomes = []
    for loops in (pool_loops.PYTHON, compiled_loops()):
        mine = copy.deepcopy(state)
        try:
            result: object = getattr(loops, call)(*mine, *args)
        except (IndexError, KeyError, ValueError) as error:
            result = type(error)
        outcomes.append((result, [list(part.items()) if isinstance(part, dict) else part for part in mine]))
    assert outcomes[0] == outcomes[1]


@settings(max_examples=500)
@given(st.integers(0, 2**32 - 1))
def test_enter_keys_matches_the_python_loop(seed: int) -> None:
    rng = random.Random(seed)
    _, hashes, cached = random_state(rng)
    table = random_blocks(rng, len(hashes), rng.randint(0, 16))
    count = rng.randint(0, len(table))
    keys = [rng.choice([*range(50), *((i, "k") for i in range(25)), *[PRIVATE] * 15]) for _ in range(count)]
    offset = rng.randint(0, len(table) - count)
    run_both("enter_keys", (hashes, cached), keys, table, offset, rng.randint(0, count))


@settings(max_examples=500)
@given(st.integers(0, 2**32 - 1))
def test_name_private_matches_the_python_loop(seed: int) -> None:
    # Blocks carrying PRIVATE or another key or none, each given a key (now and then one key too few or too many)
    rng = random.Random(seed)
    _, hashes, cached = random_state(rng)
    blocks = random_blocks(rng, len(hashes), rng.randint(0, 16))
    keys = [("own", i) for i in range(len(blocks) + rng.choice([0, 0, 0, 0, -1, 1]))]
    run_both("name_private", (hashes, cached), keys, blocks)


def test_name_private_worked_by_hand() -> None:
    """Blocks 0 and 2 carry PRIVATE, block 1 "x": 0 and 2 take "a" and "c" and become their entries, 1 keeps "x"."""
    for loops in (pool_loops.PYTHON, compiled_loops()):
        hashes, cached = [PRIVATE, "x", PRIVATE, None], {"x": 1}
        loops.name_private(hashes, cached, ["a", "b", "c"], [0, 1, 2])
        assert (hashes, cached) == (["a", "x", "c", None], {"x": 1, "a": 0, "c": 2})


class Walked:
    """An iterable that is not a list (each walk a fresh iterator): ``lookup`` walks it up to the first miss."""

    def __init__(self, items: list) -> None:
        self.items = items

    def __iter__(self) -> Iterator:
        return iter(self.items)


@settings(max_examples=500)
@given(st.integers(0, 2**32 - 1))
def test_the_block_loops_match_the_python_loops(seed: int) -> None:
    rng = random.Random(seed)
    refs, hashes, cached = random_state(rng)
    blocks = random_blocks(rng, len(refs), rng.randint(0, 12))
    run_both("hold_evicting", (refs, hashes, cached), blocks)
    run_both("free_unshared", (refs,), blocks)
    run_both("set_refs", (refs,), blocks, rng.choice([0, 1]))
    run_both("add_references", (refs,), blocks + blocks[:rng.randint(0, 2)])  # (a block twice: revived, then shared)
    carried = [key for key in hashes if key is not None]  # (``PRIVATE`` among them: a miss)
    keys = rng.sample(carried, len(carried)) + [rng.choice([*range(50), (3, "k")]) for _ in range(rng.randint(0, 3))]
    run_both("lookup", (cached,), keys[:rng.randint(0, len(keys))])
    run_both("lookup", (cached,), Walked(keys))



def random_sequences(rng: random.Random) -> tuple[dict[int, SequenceState], list[int]]:
    """Sequences mostly decoding (every token computed), now and then one with tokens reserved ahead or loading;
    the ids a step grows, now and then one unknown."""
    sequences = {}
    for sequence_id in range(rng.randint(0, 8)):
        length = rng.randint(0, 70)
        keys = [PRIVATE if rng.random() < 0.2 else key for key in range(rng.randint(0, 6))]  # (PRIVATE: no entry)
        state = SequenceState(sequence_id, sequence_length=length, block_hashes=keys,
                              num_computed_tokens=length if rng.random() < 0.95 else rng.randint(0, length),
                              num_loading_tokens=0 if rng.random() < 0.95 else rng.randint(1, 8),
                              num_cached_blocks=[rng.randint(0, 5)], num_held_blocks=rng.randint(0, 6))
        sequences[sequence_id] = state
    ids = rng.sample(list(sequences), rng.randint(0, len(sequences)))
    if rng.random() < 0.05:
        ids.insert(rng.randint(0, len(ids)), 99)
    return sequences, ids


@settings(max_examples=500)
@given(st.integers(0, 2**32 - 1))
def test_grow_lengths_matches_the_python_loop(seed: int) -> None:
    """The same answer (states, how many grew, blocks taken, takes, fills, each state named by its id) and the same
    lengths after, whether the step grows, stops at a take the free blocks cannot cover, or undoes its moves."""
    rng = random.Random(seed)
    sequences, ids = random_sequences(rng)
    args = (ids, rng.randint(1, 20), rng.choice([1, 2, 4, 16]), rng.randint(1, 2), rng.randint(0, 12),
            rng.choice([-1, 0]))
    outcomes = []
    for loops in (pool_loops.PYTHON, compiled_loops()):
        mine = copy.deepcopy(sequences)
        answer = loops.grow_lengths(mine, *args)
        if answer is not None:
            states, num_grown, num_taken, takes, fills = answer
            answer = ([state.sequence_id for state in states], num_grown, num_taken,
                      [(state.sequence_id, count) for state, count in takes],
                      [(state.sequence_id, stop) for state, stop in fills])
        outcomes.append((answer, [(state.sequence_length, state.num_computed_tokens) for state in mine.values()]))
    assert outcomes[0] == outcomes[1]


def random_fills_and_takes(rng: random.Random) -> tuple[dict[int, SequenceState], list, list, int]:
    """Sequences of one or two groups with tables, keys (``PRIVATE`` among them, often more than once) and cached
    counts; fills (state, stop) and takes (state, blocks per group) over some of them, as ``grow_lengths`` lists them
    (stops from below the cached count to past the keys), and the number of groups."""
    num_groups = rng.choice([1, 1, 2])
    sequences = {}
    for sequence_id in range(rng.randint(0, 6)):
        num_blocks = rng.randint(0, 8)
        sequences[sequence_id] = SequenceState(
            sequence_id, block_tables=[[fresh(rng.randrange(1000)) for _ in range(num_blocks)]
                                       for _ in range(num_groups)],
            block_hashes=[rng.choice([*range(30), (1, "k"), (2, "k"), *[PRIVATE] * 8])
                          for _ in range(rng.randint(0, 8))],
            num_cached_blocks=[rng.randint(0, 5) for _ in range(num_groups)], num_held_blocks=rng.randint(0, 10),
            final_length=rng.choice([None, rng.randint(0, 200)]))
    states = list(sequences.values())
    fills = [(state, rng.randint(0, 9)) for state in rng.sample(states, rng.randint(0, len(states)))]
    takes = [(state, rng.randint(0, 3)) for state in rng.sample(states, rng.randint(0, len(states)))]
    return sequences, fills, takes, num_groups


def named(sequences: dict[int, SequenceState]) -> list:
    """What the passes change: each state's tables, held blocks and cached counts."""
    return [(state.block_tables, state.num_held_blocks, state.num_cached_blocks) for state in sequences.values()]


@settings(max_examples=500)
@given(st.integers(0, 2**32 - 1))
def test_the_passes_after_grow_lengths_match_the_python_loops(seed: int) -> None:
    """fill_keys (the keys filled, or None where one repeats or is cached), hand_out (the taken blocks onto the
    tables, group by group) and fill_blocks (the blocks filled, the cached counts moved): the same answers and
    states."""
    rng = random.Random(seed)
    sequences, fills, takes, num_groups = random_fills_and_takes(rng)
    cached = {key: fresh(500 + key) for key in rng.sample(range(30), rng.choice([0, 0, 3]))}
    taken = [fresh(2000 + i) for i in range(sum(count for _, count in takes) * num_groups + rng.randint(0, 2))]
    group = rng.randrange(num_groups)
    listing, block_size = rng.random() < 0.5, rng.choice([1, 16])  # (states past their final length: a dict)
    outcomes = []
    for loops in (pool_loops.PYTHON, compiled_loops()):
        mine = copy.deepcopy((sequences, fills, takes))
        keys = loops.fill_keys(mine[1], group, dict(cached))
        past_final = {"listed before": None} if listing else None
        loops.hand_out(mine[2], list(taken), num_groups, past_final, block_size)
        blocks = loops.fill_blocks(mine[1], group)
        outcomes.append((keys, blocks, named(mine[0]),
                         None if past_final is None else [(k, v and v.sequence_id) for k, v in past_final.items()]))
    assert outcomes[0] == outcomes[1]


def test_the_passes_after_grow_lengths_worked_by_hand() -> None:
    """Two sequences of one group: the first fills blocks 1 and 2 (keys "b", "c"), the second block 0 (key "x");
    the first takes two blocks, the second one. A repeated key, or one already cached, answers None."""
    for loops in (pool_loops.PYTHON, compiled_loops()):
        first = SequenceState(0, block_tables=[[10, 11, 12]], block_hashes=["a", "b", "c"], num_cached_blocks=[1],
                              num_held_blocks=3)
        second = SequenceState(1, block_tables=[[20]], block_hashes=["x"], num_cached_blocks=[0], num_held_blocks=1)
        fills = [(first, 3), (second, 1)]
        assert loops.fill_keys(fills, 0, {"a": 10}) == ["b", "c", "x"]
        assert loops.fill_keys(fills, 0, {"x": 7}) is None
        assert loops.fill_keys([(first, 3), (first, 3)], 0, {}) is None
        first.final_length, second.final_length = 80, 20  # (after the take: 5 blocks of 16 slots, 2)
        past_final: dict = {}
        loops.hand_out([(first, 2), (second, 1)], [30, 31, 32], 1, past_final, 16)
        assert past_final == {1: second}  # (80 slots hold the first's 80 tokens; 32 pass the second's 20)
        assert (first.block_tables, second.block_tables) == ([[10, 11, 12, 30, 31]], [[20, 32]])
        assert (first.num_held_blocks, second.num_held_blocks) == (5, 2)
        assert loops.fill_blocks(fills, 0) == [11, 12, 20]
        assert (first.num_cached_blocks, second.num_cached_blocks) == ([3], [1])


def test_private_keys_worked_by_hand() -> None:
    """``PRIVATE`` is carried and counted, never entered nor looked for: block 0 carries it, block 1 key "x". Block 0
    takes it again, block 1 "a" (dropping "x"), block 2 takes it: one entry, "a". Then all three are evicted: each
    carried a key, and the map is empty. Twice ``PRIVATE`` among a step's fills is no repeated key."""
    for loops in (pool_loops.PYTHON, compiled_loops()):
        refs, hashes, cached = [0, 0, 0], [PRIVATE, "x", None], {"x": 1}
        assert loops.enter_keys(hashes, cached, [PRIVATE, "a", PRIVATE], [0, 1, 2], 0, 0) == 3
        assert (hashes, cached) == ([PRIVATE, "a", PRIVATE], {"a": 1})
        assert loops.lookup(cached, ["a", PRIVATE, "a"]) == [1]
        assert loops.hold_evicting(refs, hashes, cached, [0, 1, 2]) == 3
        assert (refs, hashes, cached) == ([1, 1, 1], [None, None, None], {})
        state = SequenceState(0, block_tables=[[10, 11, 12]], block_hashes=[PRIVATE, PRIVATE, "c"],
                              num_cached_blocks=[0], num_held_blocks=3)
        assert loops.fill_keys([(state, 3)], 0, {}) == [PRIVATE, PRIVATE, "c"]
        assert loops.fill_keys([(state, 3)], 0, {"c": 7}) is None


def test_the_python_loops_read_a_key_met_as_the_caller_resolves_it() -> None:
    """Worked by hand: block 2 takes key "a", which block 0 already caches: enter_keys stops there (index 1), having
    dropped block 2's old key "x"; block 3 is untouched."""
    for loops in (pool_loops.PYTHON, compiled_loops()):
        hashes, cached = ["a", None, "x", None], {"a": 0, "x": 2}
        assert loops.enter_keys(hashes, cached, ["b", "a", "c"], [1, 2, 3], 0, 0) == 1
        assert (hashes, cached) == (["a", "b", "a", None], {"a": 0, "b": 1})


def test_an_entry_of_the_same_block_is_no_meeting() -> None:
    """Block 300's id as two int objects (past the cached small ints): a key whose entry is block 300 already is
    not met when block 300 takes it (Python compares the ids' values, not the objects)."""
    for loops in (pool_loops.PYTHON, compiled_loops()):
        hashes, cached = [None] * 301, {"a": fresh(300)}
        assert loops.enter_keys(hashes, cached, ["a"], [fresh(300)], 0, 0) == 1
        assert hashes[300] == "a" and cached == {"a": 300}


def test_loops_follows_minipaged_native(monkeypatch: pytest.MonkeyPatch) -> None:
    compiled = compiled_loops()
    monkeypatch.setattr(native_build, "native_setting", lambda: "0")
    assert pool_loops.loops() is pool_loops.PYTHON and pool_loops.compiled() is None
    assert BlockPool(4).loops is pool_loops.PYTHON
    monkeypatch.setattr(native_build, "native_setting", lambda: "")
    assert pool_loops.loops() is compiled
    monkeypatch.setattr(pool_loops, "_compiled", lambda: RuntimeError("no C compiler"))
    assert pool_loops.loops() is pool_loops.PYTHON  # (no compiler: the Python loops, silently)
    monkeypatch.setattr(native_build, "native_setting", lambda: "1")
    with pytest.raises(RuntimeError, match=r"MINIPAGED_NATIVE=1.*no C compiler"):
        pool_loops.loops()
