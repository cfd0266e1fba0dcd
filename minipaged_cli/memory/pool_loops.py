"""The memory plane's hottest loops: the block pool's per-block ones (``BlockPool``: a prompt's keys entered, its hit
looked up and held, evicted entries dropped, counts set) and a step's passes over its decoding sequences
(``grow_lengths``, then ``fill_keys``, ``hand_out`` and ``fill_blocks``, for ``batched_growth.grow_together``). Here
in Python, the reference, and compiled from ``pool_loops.c`` (CPython's C API) where this machine can build it: the
same functions, arguments and results. (The compiled module also holds ``bulk.full_attention_profile``, whose
reference, in NumPy, is ``bulk.python_full_attention_profile``: ``compiled()`` hands out the module.)

A replay with prefix caching moves every prompt's blocks through these loops (the Mooncake trace: 9 million
blocks), each block a few list and dict operations, and every running sequence through ``grow_lengths`` at every
step (two million times on that trace); in Python the interpreter's bytecodes around those operations cost more than
the operations. Around them, the pool's own calls cost a handful of Python frames each, hundreds of thousands of
times: ``take_into``, ``cache_into``, ``release_into``, ``grow_batch`` and the others of ``whole_calls.py`` run a whole
take, caching, release, step's growth, creation or admission check compiled where the pool is in its usual case, and
in Python answer False or None (the caller's own path, their reference).
``loops()`` picks the compiled ones, built once per Python and cached in ~/.cache/minipaged
(``native_build.build_extension``), and these where there is no C compiler or no ``Python.h``.
``MINIPAGED_NATIVE=0`` keeps these; ``MINIPAGED_NATIVE=1`` fails where the build does. The two make the same
decisions: ``tests/memory/test_pool_loops.py`` drives both over random pools and sequences and compares every list,
map and length, and the pool's and the growth's property tests run under each.

The pool's per-block state: ``refs[block]`` its reference count, ``hashes[block]`` the key it is cached under (None:
none); ``cached`` maps a key to the block a hit gets. A block may carry ``PRIVATE`` instead of its key: content no
other sequence asks for, cached (counted, queued and evicted as any cached block) with no entry in ``cached``.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from types import ModuleType

from minipaged_cli import native_build
from minipaged_cli.memory import whole_calls
from minipaged_cli.memory.allocators import Holding
from minipaged_cli.memory.sequence import SequenceState, num_blocks_for


class _Private:
    """The type of ``PRIVATE``: one instance, which a copy or a pickle keeps (the loops test it by identity)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "PRIVATE"

    def __reduce__(self) -> str:
        return "PRIVATE"


# The key a block carries in place of its own where no other sequence can ask for its content
# (``sim/private_keys.py``): the pool caches the block, queues it among the cached and counts its eviction, with no
# entry in a cache map, so that no dict is written for it when it fills nor when it is evicted. A lookup never finds
# it, as no lookup would find its key.
PRIVATE = _Private()


def enter_keys(hashes: list[Hashable | None], cached: dict[Hashable, int], keys: Sequence[Hashable],
               table: Sequence[int], offset: int, start: int) -> int:
    """For i from ``start``: block ``table[offset + i]`` drops the entry of the key it carried, if any, takes
    ``keys[i]`` and becomes its entry unless the key has one (or is ``PRIVATE``). Returns the first i whose key has
    another block's entry (the caller resolves that one and goes on from i + 1), else len(keys). (A table holds a
    block once.)"""
    add = cached.setdefault  # (one hash lookup where ``in`` then a store take two)
    blocks = table[offset + start:offset + len(keys)]
    for key, block in zip(keys[start:], blocks, strict=True):
        old = hashes[block]
        if old is not None and old is not PRIVATE:
            del cached[old]
        hashes[block] = key
        if key is not PRIVATE and add(key, block) != block:
            return start + blocks.index(block)  # (rare: no count kept per block for it)
    return len(keys)


def hold_evicting(refs: list[int], hashes: list[Hashable | None], cached: dict[Hashable, int],
                  blocks: Sequence[int]) -> int:
    """Hold each of ``blocks`` once and drop the key it carries, if any, and its entry (one cache map, no
    duplicates); how many carried one."""
    keyed = 0
    for block in blocks:
        refs[block] = 1
        key = hashes[block]
        if key is not None:
            if key is not PRIVATE:
                del cached[key]
            hashes[block] = None
            keyed += 1
    return keyed


def name_private(hashes: list[Hashable | None], cached: dict[Hashable, int], keys: Sequence[Hashable],
                 blocks: Sequence[int]) -> None:
    """Each of ``blocks`` that carries ``PRIVATE`` takes its key in ``keys`` (the same place) and becomes its entry
    (a block carrying ``PRIVATE`` is no key's entry)."""
    for key, block in zip(keys, blocks, strict=True):
        if hashes[block] is PRIVATE:
            hashes[block] = key
            cached[key] = block


def free_unshared(refs: list[int], blocks: Sequence[int]) -> int:
    """Count each of ``blocks`` down from 1 to 0 up to the first held more than once; returns its index (else
    len(blocks)), its count and the rest's unchanged. (No block is in ``blocks`` twice.)"""
    for block in blocks:
        if refs[block] != 1:
            return blocks.index(block)
        refs[block] = 0
    return len(blocks)


def lookup(cached: dict[Hashable, int], keys: Iterable[Hashable]) -> list[int]:
    """The entries of ``keys`` in ``cached``, from the first key up to the first without one (a prompt's hit)."""
    hits = []
    get = cached.get
    for key in keys:
        block = get(key)
        if block is None:
            break
        hits.append(block)
    return hits


def add_references(refs: list[int], blocks: Sequence[int]) -> tuple[list[int], int]:
    """One more holder for each of ``blocks``: those no one held (in order: the caller takes them off the free
    queue), and how many others were held already."""
    revived = []
    num_shared = 0
    for block in blocks:
        if refs[block]:
            num_shared += 1
        else:
            revived.append(block)
        refs[block] += 1
    return revived, num_shared


def set_refs(refs: list[int], blocks: Sequence[int], value: int) -> None:
    """Each of ``blocks`` held ``value`` times."""
    for block in blocks:
        refs[block] = value


def grow_lengths(sequences: dict[Hashable, SequenceState], sequence_ids: Sequence[Hashable], num_tokens: int,
                 block_size: int, num_groups: int, num_free: int, cached_group: int
                 ) -> tuple[list[SequenceState], int, int, list[tuple[SequenceState, int]],
                            list[tuple[SequenceState, int]]] | None:
    """``batched_growth.grow_together``'s pass over the sequences: each one's lengths moved by ``num_tokens``, in
    order, up to the first whose new blocks the ``num_free`` free blocks cannot cover. Returns the states, how many
    grew, the blocks they take, and (state, blocks per group) for each that takes blocks and (state, its full blocks)
    for each that fills a block group ``cached_group`` caches (-1: none); None, nothing changed, for an unknown
    sequence or one with tokens reserved ahead or loading (``grow`` one at a time)."""
    try:
        states = [sequences[sequence_id] for sequence_id in sequence_ids]
    except KeyError:
        return None
    takes, fills = [], []
    num_grown, num_taken = len(states), 0
    for done, state in enumerate(states):
        length = state.sequence_length
        if state.num_computed_tokens != length or state.num_loading_tokens:
            move_lengths(states[:done], -num_tokens)
            return None
        new_length = length + num_tokens
        # (the common case, a step inside its last block, first; without a window every group's table holds as
        # many blocks as the first, none null, so the held blocks count them without a look at the tables)
        if new_length * num_groups > state.num_held_blocks * block_size:
            per_group = num_blocks_for(new_length, block_size) - state.num_held_blocks // num_groups
            if num_taken + per_group * num_groups > num_free:
                num_grown = done  # (one at a time, this one's take fails: it and the rest stay as they are)
                break
            num_taken += per_group * num_groups
            takes.append((state, per_group))
        if cached_group >= 0 and new_length // block_size > state.num_cached_blocks[cached_group]:
            fills.append((state, min(new_length // block_size, len(state.block_hashes))))
        state.sequence_length = state.num_computed_tokens = new_length
    return states, num_grown, num_taken, takes, fills


def fill_keys(fills: list[tuple[SequenceState, int]], group: int,
              cached: dict[Hashable, int]) -> list[Hashable] | None:
    """The keys of the blocks that ``grow_lengths``' ``fills`` fill in ``group`` (each (state, stop): its keys from
    the group's ``num_cached_blocks`` to ``stop``), in order; None where one is among them twice or ``cached`` has
    an entry for one (``grow_together`` then grows the sequences one at a time)."""
    keys: list[Hashable] = []
    for state, stop in fills:
        keys += state.block_hashes[state.num_cached_blocks[group]:stop]
    entered = [key for key in keys if key is not PRIVATE]  # (``PRIVATE`` makes no entry)
    if len(set(entered)) != len(entered) or not cached.keys().isdisjoint(entered):
        return None
    return keys


def hand_out(takes: list[tuple[SequenceState, int]], taken: list[int], num_groups: int,
             past_final: dict[Hashable, SequenceState] | None = None, block_size: int = 0) -> None:
    """The blocks ``taken`` onto the tables of ``grow_lengths``' ``takes`` (each (state, blocks per group)), in
    order and group by group, as ``KVBlockManager._take`` puts them; each state's held blocks counted; and, where
    ``past_final`` is given (the manager's, one group), each state whose table now holds slots past its
    ``final_length`` listed in it by its id, as ``take_cached.note_past_final`` lists it."""
    position = 0
    for state, per_group in takes:
        for table in state.block_tables:
            table += taken[position:position + per_group]
            position += per_group
        state.num_held_blocks += per_group * num_groups
        if past_final is not None and state.holds_past_final(block_size):
            past_final[state.sequence_id] = state


def fill_blocks(fills: list[tuple[SequenceState, int]], group: int) -> list[int]:
    """The blocks whose keys ``fill_keys`` gave, in its order; each state's ``num_cached_blocks[group]`` moved to
    its stop."""
    blocks: list[int] = []
    for state, stop in fills:
        cached = state.num_cached_blocks
        blocks += state.block_tables[group][cached[group]:stop]
        if stop > cached[group]:
            cached[group] = stop
    return blocks


def move_lengths(states: Sequence[SequenceState], delta: int) -> None:
    """Both lengths of each of ``states`` moved by ``delta`` (all their tokens are computed): ``grow_lengths``'s
    moves undone."""
    for state in states:
        state.sequence_length = state.num_computed_tokens = state.sequence_length + delta


@dataclass(frozen=True)
class Loops:
    """One implementation of each loop: a pool holds one (functions, not a module: a pool deep-copies)."""

    enter_keys: Callable[..., int]
    hold_evicting: Callable[..., int]
    name_private: Callable[..., None]
    free_unshared: Callable[..., int]
    set_refs: Callable[..., None]
    lookup: Callable[..., list[int]]
    add_references: Callable[..., tuple[list[int], int]]
    grow_lengths: Callable[..., tuple | None]
    fill_keys: Callable[..., list | None]
    hand_out: Callable[..., None]
    fill_blocks: Callable[..., list[int]]
    take_into: Callable[..., bool]
    cache_into: Callable[..., bool]
    grow_batch: Callable[..., int | bool | None]
    release_into: Callable[..., bool]
    create_into: Callable[..., SequenceState | bool]
    admission_headroom: Callable[..., int | None]
    release_sequence_into: Callable[..., bool]
    remove_free: Callable[..., bool]

    @classmethod
    def of(cls, *modules: ModuleType) -> Loops:
        """Each loop from the first of ``modules`` that has it (AttributeError naming a loop none has)."""
        return cls(*(getattr(next((m for m in modules if hasattr(m, f.name)), modules[0]), f.name)
                     for f in fields(cls)))


@cache
def _compiled() -> tuple[ModuleType, Loops] | RuntimeError:
    """The compiled module and its loops, or why they could not be built (asked once a process)."""
    module = native_build.built("_pool_loops", Path(__file__).with_suffix(".c"))
    if isinstance(module, RuntimeError):
        return module
    module.bind_sequence_state(SequenceState)
    module.bind_holding(Holding)
    module.bind_private(PRIVATE)
    return module, Loops.of(module)


def compiled() -> ModuleType | None:
    """The compiled module where it builds (unless ``MINIPAGED_NATIVE=0``), else None: the Python loops serve."""
    built = native_build.chosen(_compiled, "memory/pool_loops.c")
    return None if built is None else built[0]


def loops() -> Loops:
    """The compiled loops where they build (unless ``MINIPAGED_NATIVE=0``), else this module's."""
    if compiled() is None:
        return PYTHON
    built = _compiled()
    assert not isinstance(built, RuntimeError), "compiled() answers None where the build failed"
    return built[1]


PYTHON = Loops.of(sys.modules[__name__], whole_calls)
