"""``block_content_keys`` (a key per full block of a stream of labelled runs, one digest a run) against the naive
chained hash of every block's tokens: two blocks get equal keys exactly when the streams hold the same tokens up
to and including them, whatever the runs' lengths, alignment and repeats."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged_cli.memory.prefix import block_content_keys, hash_blocks, token_block_contents

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
