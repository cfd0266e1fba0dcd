"""The block pool's per-block loops (``BlockPool``, ``take_cached``): here in Python, the reference, and compiled from
``pool_loops.c`` (CPython's C API) where this machine can build it: the same functions, arguments and results.

A replay with prefix caching moves every prompt's blocks through these loops (the Mooncake trace: 9 million
blocks), each block a few list and dict operations; in Python the interpreter's bytecodes around those operations
cost more than the operations. ``loops()`` picks the compiled ones, built once per Python and cached in
~/.cache/minipaged (``native_build.build_extension``), and these where there is no C compiler or no ``Python.h``.
``MINIPAGED_NATIVE=0`` keeps these; ``MINIPAGED_NATIVE=1`` fails where the build does (the tests' setting). The two
make the same decisions: ``tests/memory/test_pool_loops.py`` drives both over random pools and compares every list
and map, and the pool's property tests run under each.

The pool's per-block state: ``refs[block]`` its reference count, ``hashes[block]`` the key it is cached under (None:
none); ``cached`` maps a key to the block a hit gets.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path
from types import ModuleType


def enter_keys(refs: list[int] | None, hashes: list[Hashable | None], cached: dict[Hashable, int],
               keys: Sequence[Hashable], table: Sequence[int], offset: int, start: int) -> int:
    """For i from ``start``: block ``table[offset + i]`` is held once (where ``refs`` is given), drops the entry of
    the key it carried, if any, takes ``keys[i]`` and becomes its entry unless the key has one. Returns the first i
    whose key has another block's entry (the caller resolves that one and goes on from i + 1), else len(keys).
    (A table holds a block once.)"""
    add = cached.setdefault  # (one hash lookup where ``in`` then a store take two)
    blocks = table[offset + start:offset + len(keys)]
    for key, block in zip(keys[start:], blocks, strict=True):
        if refs is not None:
            refs[block] = 1
        old = hashes[block]
        if old is not None:
            del cached[old]
        hashes[block] = key
        if add(key, block) != block:
            return start + blocks.index(block)  # (rare: no count kept per block for it)
    return len(keys)


def hold_evicting(refs: list[int], hashes: list[Hashable | None], cached: dict[Hashable, int],
                  blocks: Sequence[int]) -> None:
    """Hold each of ``blocks`` once and drop the entry of the key it carries, if any (one cache map, no duplicates)."""
    for block in blocks:
        refs[block] = 1
        key = hashes[block]
        if key is not None:
            del cached[key]
            hashes[block] = None


def free_unshared(refs: list[int], blocks: Sequence[int]) -> int:
    """Count each of ``blocks`` down from 1 to 0 up to the first held more than once; returns its index (else
    len(blocks)), its count and the rest's unchanged. (No block is in ``blocks`` twice.)"""
    for block in blocks:
        if refs[block] != 1:
            return blocks.index(block)
        refs[block] = 0
    return len(blocks)


def set_refs(refs: list[int], blocks: Sequence[int], value: int) -> None:
    """Each of ``blocks`` held ``value`` times."""
    for block in blocks:
        refs[block] = value


@dataclass(frozen=True)
class Loops:
    """One implementation of each loop: a pool holds one (functions, not a module: a pool deep-copies)."""

    enter_keys: Callable[..., int]
    hold_evicting: Callable[..., None]
    free_unshared: Callable[..., int]
    set_refs: Callable[..., None]

    @classmethod
    def of(cls, module: ModuleType) -> Loops:
        return cls(*(getattr(module, field.name) for field in fields(cls)))


@cache
def _compiled() -> Loops | RuntimeError:
    """The compiled loops, or why they could not be built (asked once a process)."""
    from minipaged_cli.native_build import build_extension

    try:
        return Loops.of(build_extension("_pool_loops", Path(__file__).with_suffix(".c")))
    except RuntimeError as error:
        return error


def loops() -> Loops:
    """The compiled loops where they build (unless ``MINIPAGED_NATIVE=0``), else this module's."""
    setting = os.environ.get("MINIPAGED_NATIVE", "")
    compiled = PYTHON if setting == "0" else _compiled()
    if isinstance(compiled, RuntimeError):
        if setting == "1":
            raise RuntimeError(f"MINIPAGED_NATIVE=1, but the block pool's compiled loops did not build: {compiled}")
        return PYTHON
    return compiled


PYTHON = Loops.of(sys.modules[__name__])
