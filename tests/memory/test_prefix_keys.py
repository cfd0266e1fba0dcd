"""``prefix_keys.c`` against ``prefix.py``, its reference: ``content_hash``, ``block_content_keys`` and
``segment_keys`` give the same keys, or raise the same error, on random contents and runs. Those cover the shapes the
C pickles itself (None, ints of any size, strings, tuples of them, an object repeated, which the pickler's memo names
the second time) and those it hands to the reference (bools, floats, bytes, ints past 64 bits, strings UTF-8 cannot
encode or of 256 bytes and more, pickles past its buffer, runs that are not (label, int) pairs, a block size that is
not a positive int, a segment missing or not an int, segments that are not a dict). The reference's own test
(``test_prefix.py``) checks its keys against hashlib's BLAKE2b and a naive chain, under both."""

from __future__ import annotations

from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged_cli import native_build
from minipaged_cli.memory import prefix as prefix_module
from tests.memory.conftest import usable

# Objects that recur by identity (what a replay's labels are: the trace's segment names, a request's own labels).
SHARED: list[Any] = ["h0", "prompt", ("prompt", 3), ("output", 3, 0), "é", ("prompt", ("h0", 2))]
LEAVES = st.one_of(st.none(), st.integers(-2**70, 2**70), st.sampled_from([0, 255, 256, 65535, 65536, 2**31 - 1,
                                                                           2**31, -2**31, -2**31 - 1, -2**39,
                                                                           2**63 - 1, -2**63, 2**63]),
                   st.text(max_size=300), st.text(min_size=100, max_size=300), st.sampled_from(SHARED),
                   # (pickles past BLAKE2b's 128-byte block; strings about 256 UTF-8 bytes, the short form's limit)
                   st.sampled_from(["x" * 127, "x" * 200, "x" * 255, "x" * 256, "é" * 127, "é" * 128]),
                   st.just("\ud800"), st.booleans(), st.floats(allow_nan=False), st.binary(max_size=4))
CONTENTS = st.recursive(LEAVES, lambda children: st.lists(children, max_size=5).map(tuple), max_leaves=14)
PARENTS = st.one_of(st.none(), st.integers(0, 2**61), st.integers(-2**65, 2**65), st.booleans())


def compiled() -> ModuleType:
    """The compiled module (``usable``: skips where this machine cannot build it)."""
    return usable(prefix_module._compiled())


def outcome(function: Callable[..., Any], *args: Any) -> Any:
    """What ``function`` returns, or the type and message of what it raises."""
    try:
        return function(*args)
    except Exception as error:  # (the same error is the same outcome)
        return type(error), str(error)


@settings(max_examples=600, deadline=None)
@given(parent=PARENTS, content=CONTENTS, repeated=st.sampled_from(SHARED))
def test_content_hash_is_the_references(parent: Any, content: Any, repeated: Any) -> None:
    module = compiled()
    for shaped in (content, (repeated, content, (repeated, 1, 2), repeated)):
        assert outcome(module.content_hash, parent, shaped) == outcome(prefix_module.content_hash, parent, shaped)


LABELS = st.one_of(st.sampled_from(SHARED), LEAVES)
RUNS = st.lists(st.one_of(st.tuples(LABELS, st.one_of(st.integers(0, 40), st.integers(-40, 600),
                                                      st.sampled_from([512, 2**41, True, 1.0]))),
                          st.lists(st.integers(0, 20), min_size=2, max_size=2)), max_size=10)


@settings(max_examples=600, deadline=None)
@given(runs=RUNS, block_size=st.sampled_from([1, 3, 4, 16, 16, 32, 0, -1, True, 2**40]),
       as_iterator=st.booleans())
def test_block_content_keys_are_the_references(runs: list[Any], block_size: Any, as_iterator: bool) -> None:
    module = compiled()
    given_runs = iter(runs) if as_iterator else runs
    assert outcome(module.block_content_keys, given_runs, block_size) == \
        outcome(prefix_module.python_block_content_keys, runs, block_size)


def test_a_repeated_label_is_pickled_as_the_picklers_memo_names_it() -> None:
    # Four pieces of one block: the label object "ab" pickled once, then named by its memo index (BINGET), inside a
    # tuple and alone; an equal string that is another object is pickled again. Against hashlib through the reference.
    module = compiled()
    a, other_a = "ab", "".join(["a", "b"])
    assert a is not other_a
    runs = [(a, 3), (("b", a), 5), (a, 4), (other_a, 4), ("c", 40)]
    keys = module.block_content_keys(runs, 16)
    assert keys == prefix_module.python_block_content_keys(runs, 16)
    pieced = prefix_module.content_hash(None, ((a, 0, 3), (("b", a), 0, 5), (a, 0, 4), (other_a, 0, 4)))
    assert keys[0] == pieced and keys[1] == prefix_module.content_hash(pieced, ("c", 0))


SEGMENTS = {"h0": 512, "h1": 40, ("prompt", 3): 7, "h3": 0, "odd": True, "h4": 2**41}


@settings(max_examples=400, deadline=None)
@given(prefix=st.lists(st.sampled_from([*SEGMENTS, "missing", ["unhashable"]]), max_size=8).map(tuple),
       own=RUNS, block_size=st.sampled_from([1, 16, 16, 0]), as_dict=st.booleans())
def test_segment_keys_are_the_references(prefix: tuple[Any, ...], own: list[Any], block_size: Any,
                                        as_dict: bool) -> None:
    module = compiled()
    segments: Any = dict(SEGMENTS) if as_dict else MappingProxy(SEGMENTS)
    assert outcome(module.segment_keys, prefix, segments, own, block_size) == \
        outcome(prefix_module.python_segment_keys, prefix, segments, own, block_size)


class MappingProxy(dict):
    """A mapping that is not exactly a dict (the compiled version hands it to the reference)."""


def test_keys_follow_minipaged_native(monkeypatch: pytest.MonkeyPatch) -> None:
    module = compiled()
    references = (prefix_module.python_block_content_keys, prefix_module.python_segment_keys)
    try:
        monkeypatch.setattr(native_build, "native_setting", lambda: "0")
        prefix_module._keys_functions.cache_clear()
        assert prefix_module._keys_functions() == references
        monkeypatch.setattr(native_build, "native_setting", lambda: "")
        prefix_module._keys_functions.cache_clear()
        assert prefix_module._keys_functions() == (module.block_content_keys, module.segment_keys)
        monkeypatch.setattr(prefix_module, "_compiled", lambda: RuntimeError("no C compiler"))
        prefix_module._keys_functions.cache_clear()
        assert prefix_module._keys_functions() == references  # (silently)
        monkeypatch.setattr(native_build, "native_setting", lambda: "1")
        prefix_module._keys_functions.cache_clear()
        with pytest.raises(RuntimeError, match=r"MINIPAGED_NATIVE=1.*prefix_keys\.c.*no C compiler"):
            prefix_module._keys_functions()
    finally:
        monkeypatch.undo()
        prefix_module._keys_functions.cache_clear()
