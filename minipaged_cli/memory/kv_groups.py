"""KV cache groups: how vLLM's hybrid KV cache manager splits a model's layers over one pool of one page size.

vLLM (``_get_kv_cache_groups_uniform_page_size``, v1/core/kv_cache_planning.py) buckets the layers by attention
type in the order the types first appear, then cuts every bucket into groups of the same number of layers, so
that one block of any group costs the same bytes: ``group_size`` layers' pages. The group size is the smallest
bucket's layer count, or the largest's when the largest is under 1.5x the smallest (gpt-oss + a drafter); a
bucket that does not divide evenly is padded (its last group's padding layers cost memory and hold nothing), and
bucket ``layers`` goes to its groups as ``layers[i::num_groups]``. Every group keeps its own block table per
sequence; all of them draw blocks from the one pool.

Worked examples: gpt-oss-20b (24 layers alternating sliding window 128 / full, sliding first) -> 12 sliding and
12 full -> group size 12, groups (sliding, full); gemma-3-27b (62 layers, every 6th global) -> 52 sliding and
10 full -> group size 10, six sliding groups (the sixth padded by 8 layers) and one full group: 70 layer-pages a
token where a dense model would pay 62 - and a sliding group lets go of tokens once they leave its window.

``--no-hybrid-kv`` (vLLM's ``--disable-hybrid-kv-cache-manager``) treats every layer as full attention: one group.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from minipaged_cli.memory.sequence import num_blocks_for
from minipaged_cli.workloads.presets import FULL_ATTENTION, SLIDING_ATTENTION, ModelSpec


@dataclass(frozen=True)
class KVCacheGroup:
    """One KV cache group: layers of one attention type sharing a block table.

    ``layer_indices`` are the model's layers in the group (fewer than ``num_layers`` in a padded group);
    ``sliding_window`` the tokens a sliding-window layer attends to (None for full attention).
    """

    kind: str  # FULL_ATTENTION or SLIDING_ATTENTION
    layer_indices: tuple[int, ...]
    num_layers: int  # layers' pages one block of the group holds, padding included
    sliding_window: int | None = None

    @property
    def is_sliding(self) -> bool:
        return self.kind == SLIDING_ATTENTION


def kv_cache_groups(model: ModelSpec, *, hybrid: bool = True) -> tuple[KVCacheGroup, ...]:
    """The model's KV cache groups as vLLM forms them; one full-attention group for a uniform model or when
    ``hybrid`` is off."""
    if not hybrid or not model.is_hybrid:
        return (KVCacheGroup(FULL_ATTENTION, tuple(range(model.num_layers)), model.num_layers),)
    buckets: dict[str, list[int]] = {}
    for index, kind in enumerate(model.layer_kinds):
        buckets.setdefault(kind, []).append(index)
    sizes = [len(layers) for layers in buckets.values()]
    group_size = max(sizes) if max(sizes) < min(sizes) * 1.5 else min(sizes)
    groups = []
    for kind, layers in buckets.items():
        num_groups = math.ceil(len(layers) / group_size)
        window = model.sliding_window if kind == SLIDING_ATTENTION else None
        groups += [KVCacheGroup(kind, tuple(layers[i::num_groups]), group_size, window) for i in range(num_groups)]
    return tuple(groups)


def block_bytes(model: ModelSpec, groups: tuple[KVCacheGroup, ...], block_size: int) -> int:
    """Bytes of one block of the pool: the largest group's pages (all groups have the same, by construction)."""
    return max(g.num_layers for g in groups) * block_size * model.kv_bytes_per_token_per_layer


def sliding_admission_blocks(window: int, block_size: int, max_in_flight_tokens: int, max_model_len: int) -> int:
    """The most blocks a sliding-window group holds for one request: its last W - 1 computed tokens plus a step's
    tokens, +1 because the window need not start at a block boundary (vLLM's
    ``SlidingWindowSpec.max_admission_blocks_per_request``, its admission cap and its pool sizing)."""
    return num_blocks_for(min(window - 1 + max_in_flight_tokens, max_model_len), block_size) + 1


def max_concurrency(groups: tuple[KVCacheGroup, ...], num_blocks: int, block_size: int, max_model_len: int,
                    max_in_flight_tokens: int) -> float:
    """vLLM's "Maximum concurrency for max_model_len tokens per request" (``get_max_concurrency_for_kv_cache_config``):
    the requests of that length the pool holds at once, a request taking ceil(max_model_len / B) blocks in a full
    group and at most ``sliding_admission_blocks`` in a sliding one."""
    per_request = sum(
        sliding_admission_blocks(g.sliding_window, block_size, max_in_flight_tokens, max_model_len)
        if g.is_sliding else num_blocks_for(max_model_len, block_size) for g in groups)
    return num_blocks / per_request


def kv_cache_size_tokens(groups: tuple[KVCacheGroup, ...], num_blocks: int, block_size: int, max_model_len: int,
                         max_in_flight_tokens: int) -> int:
    """vLLM's "KV cache size: N tokens" (``get_kv_cache_capacity``): max_model_len times ``max_concurrency``."""
    return int(max_concurrency(groups, num_blocks, block_size, max_model_len, max_in_flight_tokens) * max_model_len)
