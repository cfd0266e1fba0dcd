"""vLLM 0.34.0's cache-aware admission in the v1 scheduler (``cache_aware_admission_window`` / ``_threshold``):
a hand-worked schedule here; step by step against vLLM 0.34.0's own scheduler in ``tests/parity/test_scheduler.py``
(parity/cache_aware_cases.yaml)."""

from __future__ import annotations

import pytest

from minipaged_cli.errors import InputError
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.workloads.presets import GpuSpec, ModelSpec
from minipaged_cli.workloads.trace import Request, make_trace
from tests.sim.test_scheduler import scheduled_tokens


def _admission_order(model: ModelSpec, gpu: GpuSpec, window: int, threshold: float = 0.5) -> list[int]:
    # 10 blocks of 4 tokens, one request running at a time, a budget of 8. All arrive at t=0, in this order:
    # 0 "doc" (its 8-token document d, then 4 tokens of its own; 1 out) runs first and leaves d's 2 blocks cached;
    # 1 "hog" (20 tokens, 5 blocks, 6 out) runs next and holds 5-7 of the 10 blocks: usage >= 0.5 from its last
    # chunk on. Waiting behind it: 2 cold (8 tokens), 3 warm (d + 4: 8 tokens cached), 4 cold.
    trace = make_trace("t", [Request("doc", 0.0, 12, 1, prefix=("d",)), Request("hog", 0.0, 20, 6),
                             Request("cold-1", 0.0, 8, 2), Request("warm", 0.0, 12, 2, prefix=("d",)),
                             Request("cold-2", 0.0, 8, 2)], source="test", segments={"d": 8})
    config = SimConfig.of(model, gpu, num_blocks=10, block_size=4, max_model_len=64, max_batched_tokens=8,
                          max_num_seqs=1, prefix_caching=True, cache_aware_admission_window=window,
                          cache_aware_admission_threshold=threshold)
    steps, _ = scheduled_tokens(trace, config)
    order: list[int] = []
    for step in steps:
        order += [sequence_id for sequence_id in step if sequence_id not in order]
    return order


def test_a_cached_prefix_is_admitted_first_above_the_threshold(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    # Off (vLLM's default), arrival order. On, while the hog holds half the pool: the window [cold-1, warm, cold-2]
    # becomes [warm, cold-1, cold-2] (8 cached tokens first, arrival order between the cold ones); the hog ahead
    # of them never moves (it was admitted before the cache was half full, when nothing was reordered).
    assert _admission_order(tiny_model, clock_gpu, window=0) == [0, 1, 2, 3, 4]
    assert _admission_order(tiny_model, clock_gpu, window=3) == [0, 1, 3, 2, 4]
    # a window of 1 reorders nothing; a threshold the hog never reaches neither
    assert _admission_order(tiny_model, clock_gpu, window=1) == [0, 1, 2, 3, 4]
    assert _admission_order(tiny_model, clock_gpu, window=3, threshold=0.95) == [0, 1, 2, 3, 4]


def test_it_is_vllm_034s_option(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    base = {"num_blocks": 10, "block_size": 4, "prefix_caching": True}
    with pytest.raises(InputError, match=r"0\.34\.0"):
        SimConfig.of(tiny_model, clock_gpu, vllm_version="0.33", cache_aware_admission_window=4, **base)
    with pytest.raises(InputError, match=r"\[0, 1\]"):
        SimConfig.of(tiny_model, clock_gpu, cache_aware_admission_window=4, cache_aware_admission_threshold=1.5, **base)
    # the release's defaults: off, above half the cache once on
    config = SimConfig.of(tiny_model, clock_gpu, **base)
    assert (config.engine.cache_aware_admission_window, config.engine.cache_aware_admission_threshold) == (0, 0.5)
