"""``block_content_keys`` (a key per full block of a stream of labelled runs, one digest a run) against the naive
chained hash of every block's tokens: two blocks get equal keys exactly when the streams hold the same tokens up
to and including them, whatever the runs' lengths, alignment and repeats. Each test runs with the reference
(``python_block_content_keys``) and with the compiled version (``prefix_keys.c``)."""

from __future__ import annotations

import hashlib
import pickle

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged_cli.memory import prefix
from minipaged_cli.memory.prefix import block_content_keys, content_hash, hash_blocks, token_block_contents
from tests.memory.test_prefix_keys import compiled


@pytest.fixture(autouse=True, params=["python", "compiled"])
def keys_kind(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """``block_content_keys`` as the reference, then as the compiled version."""
    module = prefix if request.param == "python" else compiled()
    chosen = (getattr(module, f"{'python_' * (module is prefix)}block_content_keys"),
              getattr(module, f"{'python_' * (module is prefix)}segment_keys"))
    monkeypatch.setattr(prefix, "_keys_functions", lambda: chosen)
    return request.param


RUNS = st.lists(st.tuples(st.sampled_from(["a", "b", ("prompt", 1)]), st.integers(0, 40)), max_size=6)


def _naive_keys(runs: list[tuple[object, int]], block_size: int) -> list[int]:
    """Every token named (its run's label, its place in the run), each full block chained by ``hash_blocks``."""
    tokens = [(label, offset) for label, length in runs for offset in range(length)]
    return hash_blocks(token_block_contents(tokens, block_size))


@settings(max_examples=300, deadline=None)
@given(first=RUNS, second=RUNS, block_size=st.sampled_from([1, 3, 4, 16]))
def test_block_keys_are_equal_exactly_where_the_naive_tokens_keys_are(first: list[tuple[object, int]],
                                                                     second: list[tuple[object, int]],
                                                                     block_size: int) -> None:
    # A shared start (the second stream begins as the first) makes equal keys likely, not only possible.
    second = first[:len(second) // 2] + second
    keys = [block_content_keys(runs, block_size) for runs in (first, second)]
    naive = [_naive_keys(runs, block_size) for runs in (first, second)]
    assert [len(k) for k in keys] == [len(k) for k in naive]
    everything = [*keys[0], *keys[1]]
    reference = [*naive[0], *naive[1]]
    assert [[a == b for b in everything] for a in everything] == [[a == b for b in reference] for a in reference]


def _readable_keys(runs: list[tuple[object, int]], block_size: int) -> list[int]:
    """The scheme of ``block_content_keys`` one block at a time: a block that lies whole in a run, after the run's
    first ``start`` tokens ended an earlier block, is keyed ``content_hash(chain, (label, start))`` plus its place
    among the run's whole blocks, and the content up to it is named the next key; a block of pieces of several runs
    is keyed ``content_hash(chain, its pieces)``."""
    keys: list[int] = []
    chain: object = None
    pieces: list[tuple[object, int, int]] = []
    filled = 0
    for label, length in runs:
        offset, run_key, num_whole = 0, 0, 0
        while offset < length:
            if not pieces and length - offset >= block_size:
                if not num_whole:
                    run_key = content_hash(chain, (label, offset))
                keys.append(run_key + num_whole)
                num_whole += 1
                chain = run_key + num_whole
                offset += block_size
                continue
            taken = min(block_size - filled, length - offset)
            pieces.append((label, offset, offset + taken))
            filled, offset = filled + taken, offset + taken
            if filled == block_size:
                chain = content_hash(chain, tuple(pieces))
                keys.append(chain)
                pieces, filled = [], 0
    return keys


@settings(max_examples=300, deadline=None)
@given(runs=st.lists(st.tuples(st.sampled_from(["a", "b", ("prompt", 1)]), st.integers(0, 70)), max_size=8),
       block_size=st.sampled_from([1, 3, 4, 16]))
def test_block_keys_are_the_readable_construction_block_by_block(runs: list[tuple[object, int]],
                                                                block_size: int) -> None:
    # The same ints, not only the same pattern of equal keys (caches, tiers and KV events store them), from a list
    # of runs or a stream of them.
    expected = _readable_keys(runs, block_size)
    assert block_content_keys(runs, block_size) == expected
    assert block_content_keys(iter(runs), block_size) == expected


@settings(max_examples=200, deadline=None)
@given(parent=st.one_of(st.none(), st.integers(0, 2**129)),
       content=st.one_of(st.tuples(st.text(max_size=8), st.integers(0, 600)),
                         st.tuples(st.tuples(st.text(max_size=3), st.integers(), st.integers()))))
def test_content_hash_is_the_first_60_bits_of_the_blake2b_of_the_pickled_pair(parent: int | None,
                                                                             content: tuple[object, ...]) -> None:
    # The digest its docstring defines, the same bytes into BLAKE2b: keys are stored and compared by tiers and events.
    digest = hashlib.blake2b(pickle.dumps((parent, content), protocol=5), digest_size=8).digest()
    assert content_hash(parent, content) == int.from_bytes(digest, "big") >> 4
    assert content_hash(parent, content) < 2**60


def test_a_negative_run_keys_no_block_but_moves_the_chain() -> None:
    # (A request whose segments outrun its prompt has an own prompt of negative length: its keys stay as they were.)
    # The run of -20 tokens keys no block, names the content after it run key - 2 and leaves the piece (-32, -20),
    # counted as 12 tokens, to the next run, which fills the block with 4 of its own.
    run_key = content_hash(None, ("b", 0))
    pieced = content_hash(run_key - 2, (("b", -32, -20), ("c", 0, 4)))
    assert block_content_keys([("b", -20), ("c", 36)], 16) == [pieced, content_hash(pieced, ("c", 4)),
                                                               content_hash(pieced, ("c", 4)) + 1]


@settings(max_examples=200, deadline=None)
@given(names=st.lists(st.sampled_from(["a", "b", ("prompt", 1)]), max_size=6), own=RUNS,
       block_size=st.sampled_from([1, 3, 16]))
def test_segment_keys_are_the_keys_of_the_runs_listed(names: list[object], own: list[tuple[object, int]],
                                                      block_size: int) -> None:
    segments: dict[object, int] = {"a": 5, "b": 16, ("prompt", 1): 33}
    listed = [(name, segments[name]) for name in names] + own
    assert prefix.segment_keys(tuple(names), segments, own, block_size) == block_content_keys(listed, block_size)
