"""Prefix keys: chained content hashes of full KV blocks, for prefix caching.

Equal keys mean equal content of the whole prefix up to and including the block: a block's key hashes its parent's
key with its own content. ``hash_blocks`` keys blocks of token ids one by one; ``block_content_keys`` keys a token
stream described by labelled runs (a shared segment, a request's own tokens) without a Python step per block.

``block_content_keys`` and ``segment_keys`` run compiled (``prefix_keys.c``, built as ``native_build`` builds the
pool's loops, and the same keys: the C writes ``content_hash``'s pickle and digest itself) where the machine builds
it, unless ``MINIPAGED_NATIVE=0``; ``python_block_content_keys`` and ``python_segment_keys`` are their reference,
and serve elsewhere.
"""

from __future__ import annotations

import hashlib
import itertools
import pickle
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from functools import cache
from pathlib import Path
from types import ModuleType

from minipaged_cli import native_build

_BLAKE2B_64 = hashlib.blake2b(digest_size=8)  # (never updated: ``content_hash`` updates copies)
_KEY_BITS = 60


def content_hash(parent: Hashable, content: Hashable) -> int:
    """The first 60 bits of a 64-bit BLAKE2b digest of the pair (parent, content) pickled with protocol 5, as an int.

    Python's ``hash()`` is not collision resistant (``hash(-1) == hash(-2)``: token ids -1 and -2 would share a
    cache entry); vLLM moved to SHA-256 for the same reason. 60 bits of a cryptographic digest make a collision
    among ten million keys (a long replay's) a 1-in-20,000 event (n² / 2⁶¹), and keep a key an int of two 30-bit
    digits, 32 bytes where a 128-bit one takes 48: a replay holds millions at once. ``content`` must be picklable
    with a stable encoding (ints, strings, tuples of them).
    """
    hasher = _BLAKE2B_64.copy()  # (a copy skips the set-up of the parameters: a replay hashes every prompt's runs)
    hasher.update(pickle.dumps((parent, content), protocol=5))
    return int.from_bytes(hasher.digest(), "big") >> (64 - _KEY_BITS)


def hash_blocks(contents: Iterable[Hashable], parent: Hashable = None) -> list[int]:
    """Chained content hashes: block ``i``'s is ``content_hash(block i-1's hash, contents[i])``, so equal hashes
    mean equal content of the whole prefix up to and including the block, not just of the block itself."""
    hashes = []
    for content in contents:
        parent = content_hash(parent, content)
        hashes.append(parent)
    return hashes


def token_block_contents(token_ids: Sequence[int], block_size: int) -> list[tuple[int, ...]]:
    """The content of each full block of a token-id sequence, for ``hash_blocks``."""
    return [tuple(token_ids[i:i + block_size]) for i in range(0, len(token_ids) - block_size + 1, block_size)]


def block_content_keys(runs: Iterable[tuple[Hashable, int]], block_size: int) -> list[int]:
    """``python_block_content_keys``, compiled where the machine builds it (a replay keys every prompt it admits:
    each run's digest costs a microsecond in Python, a quarter of that compiled)."""
    return _keys_functions()[0](runs, block_size)


def segment_keys(prefix: Sequence[Hashable], segments: Mapping[Hashable, int], own: Iterable[tuple[Hashable, int]],
                 block_size: int) -> list[int]:
    """``python_segment_keys``, compiled where the machine builds it."""
    return _keys_functions()[1](prefix, segments, own, block_size)


def python_segment_keys(prefix: Sequence[Hashable], segments: Mapping[Hashable, int],
                        own: Iterable[tuple[Hashable, int]], block_size: int) -> list[int]:
    """``block_content_keys`` of the shared segments that ``prefix`` names, each ``segments[name]`` tokens long,
    then of the runs ``own``: a request's stream (no list of the segments' runs built first)."""
    return python_block_content_keys(itertools.chain(((name, segments[name]) for name in prefix), own), block_size)


def python_block_content_keys(runs: Iterable[tuple[Hashable, int]], block_size: int) -> list[int]:
    """Content keys of the full blocks of a token stream made of labelled runs (a segment name, or a request's
    own tokens) of the given lengths.

    Equal keys mean equal content from the start of the stream (what a chained hash guarantees): a block's key is
    the ``content_hash`` (60-bit) of the previous content and this block's pieces (label, start, end). Block i
    inside one run is keyed run key + i without a Python step per block, which matters for traces like Mooncake's
    (hundreds of blocks per prompt), and the content up to the run's end is named run key + its blocks, the next
    key past them (one digest a run: a request's prompt is dozens of runs). Every key is an int: the block pool's
    dictionaries hash it without following a tuple's pointers to scattered objects, the replay's hottest memory
    traffic. (Two keys, or two contents' names, meet only where two 60-bit digests land within a run's length of
    each other: as likely as a digest collision.)

    A replay builds a key for every block of every prompt (millions): a run's keys come from a ``range``, whose
    iterator counts in a machine word (keys stay below 2⁶³: a 60-bit digest plus a run's blocks).
    """
    keys: list[int] = []
    chain: Hashable = None  # the hash of all content before ``pieces``
    pieces: list[tuple[Hashable, int, int]] = []  # a block begun in an earlier run
    filled = 0
    for label, length in runs:
        if length == 0:
            continue
        start = 0
        if pieces:
            start = min(block_size - filled, length)
            pieces.append((label, 0, start))
            filled += start
            if filled < block_size:
                continue
            chain = content_hash(chain, tuple(pieces))
            keys.append(chain)
            pieces, filled = [], 0
        whole = (length - start) // block_size
        if whole:
            run_key = content_hash(chain, (label, start))
            chain = run_key + whole
            keys.extend(range(run_key, chain))  # (a negative length keys no block)
        if start + whole * block_size < length:
            pieces = [(label, start + whole * block_size, length)]
            filled = length - pieces[0][1]
    return keys


@cache
def _compiled() -> ModuleType | RuntimeError:
    """The compiled module, told its reference (what it hands the content it does not pickle itself), or why it
    could not be built (asked once a process)."""
    module = native_build.built("_prefix_keys", Path(__file__).with_name("prefix_keys.c"))
    if not isinstance(module, RuntimeError):
        module.bind(content_hash, python_block_content_keys, python_segment_keys)
    return module


@cache
def _keys_functions() -> tuple[Callable[..., list[int]], Callable[..., list[int]]]:
    """``block_content_keys`` and ``segment_keys``: compiled where they build (unless ``MINIPAGED_NATIVE=0``), else
    the references."""
    module = native_build.chosen(_compiled, "memory/prefix_keys.c")
    if module is None:
        return python_block_content_keys, python_segment_keys
    return module.block_content_keys, module.segment_keys
