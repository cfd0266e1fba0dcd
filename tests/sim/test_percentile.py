"""``sim.latencies.percentile`` against ``np.percentile``, the reference it stands in for: the same float, to the last
digit, for any sample and rank (the figures of every report go through it)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged_cli.sim.latencies import percentile

finite = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False, allow_infinity=False)


@settings(max_examples=400, deadline=None)
@given(values=st.lists(finite, min_size=1, max_size=300),
       q=st.one_of(st.sampled_from([0, 50, 90, 99, 100]), st.floats(min_value=0, max_value=100)))
def test_percentile_is_numpys(values: list[float], q: float) -> None:
    assert percentile(values, q) == float(np.percentile(values, q))
    assert percentile(np.array(values[::-1]), q) == float(np.percentile(values, q))


def test_percentile_worked_by_hand() -> None:
    # 99th of 1..101 falls on rank 99 (0-based: 100 * 0.99 = 99): the value 100; of 1..11, between 10 and 11 (9.9)
    assert percentile(range(1, 102), 99) == 100.0
    assert abs(percentile([11, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 99) - 10.9) < 1e-12
    assert percentile([4.5], 99) == 4.5
