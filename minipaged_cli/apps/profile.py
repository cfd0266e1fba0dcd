"""``minipaged profile``: what each block size costs and saves on one trace and one KV memory.

Smaller blocks waste less at the tail of each sequence and lose less prefix reuse to partial blocks; larger
blocks mean shorter block tables, fewer allocations, and longer contiguous runs for the attention kernel. For
each block size this replays the trace with the paged strategy (same KV bytes, so the number of blocks changes)
and times the data plane on a batch shaped like the trace's busiest step.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np

from minipaged_cli.memory.sequence import num_blocks_for, tail_waste
from minipaged_cli.sim.accounting import StrategyMetrics
from minipaged_cli.sim.categories import tail_waste_pct
from minipaged_cli.sim.config import SimConfig, num_blocks_for_memory
from minipaged_cli.sim.replay import replay
from minipaged_cli.units import rounded
from minipaged_cli.workloads.presets import ModelSpec
from minipaged_cli.workloads.trace import Trace

if TYPE_CHECKING:  # the kernel timings only: the replays (profile --device none) need no torch
    import torch

    from minipaged_cli.dataplane.backends import Backend

DEFAULT_BLOCK_SIZES = (1, 8, 16, 32, 64, 128)
BLOCK_TABLE_ENTRY_BYTES = 4  # int32
TOKEN_STATE_SLACK_PCT = 1.0  # block sizes within this many points of the best token-state share tie


@dataclass(frozen=True)
class KernelCost:
    cache_write_us_per_token: float
    attention_us: float
    attention_gbps: float
    batch: int
    tokens: int  # live tokens the timed attention read (the busiest step's, or scaled down to the cap)


@dataclass
class ProfileRow:
    block_size: int
    num_blocks: int
    metrics: StrategyMetrics
    tail_waste_pct: float  # tails of live allocations (Σ (A - L)), % of allocated slots, time-weighted
    mean_tail_waste_tokens: float  # per running sequence, time-weighted
    block_table_entries_per_sequence: float  # final table length, mean over completed requests
    block_table_bytes: int  # int32 entries of every live table at the peak
    num_block_allocations: int
    num_block_frees: int
    prefix_tokens_lost: int
    final_tail_waste: list[int] = field(default_factory=list, repr=False)  # per completed request
    kernel: KernelCost | None = None

    @property
    def expected_tail_waste_tokens(self) -> float:
        """(B - 1) / 2: the mean of (-L) mod B when lengths are spread evenly modulo B."""
        return (self.block_size - 1) / 2

    def to_dict(self) -> dict[str, float | int | None]:
        return rounded({
            "block_size": self.block_size,
            "tail_waste_pct": self.tail_waste_pct,
            "internal_frag_pct": self.metrics.internal_frag_pct,
            "mean_tail_waste_tokens": self.mean_tail_waste_tokens,
            "block_table_bytes": self.block_table_bytes,
            "num_block_allocations": self.num_block_allocations,
            "token_state_pct": self.metrics.token_state_pct,
            "mean_batch_size": self.metrics.mean_batch_size,
            "num_preemptions": self.metrics.num_preemptions,
            "prefix_tokens_lost": self.prefix_tokens_lost,
            "cache_write_us_per_token": self.kernel.cache_write_us_per_token if self.kernel else None,
            "attention_us": self.kernel.attention_us if self.kernel else None,
            "attention_gbps": self.kernel.attention_gbps if self.kernel else None,
        })


def prefix_tokens_lost(trace: Trace, block_size: int) -> int:
    """Shared-prefix tokens that block granularity keeps from being reused, with an unlimited cache.

    A request's prefix shares with earlier requests the longest run of leading segments some earlier request
    also started with; only whole blocks of that shared run can be reused, so ``shared mod block_size`` of its
    tokens are computed again.
    """
    seen: set[tuple[str, ...]] = set()  # every leading run of segments an earlier request had
    lost = 0
    for request in trace.requests:
        shared = 0
        for depth in range(1, len(request.prefix) + 1):
            if request.prefix[:depth] not in seen:
                break
            shared += trace.segments[request.prefix[depth - 1]]
        lost += shared % block_size
        seen.update(request.prefix[:depth] for depth in range(1, len(request.prefix) + 1))
    return lost


def profile_block_size(trace: Trace, config: SimConfig, block_size: int, kv_memory_bytes: int,
                       progress: Callable[[int], None] | None = None) -> ProfileRow:
    """Replay ``trace`` with the paged strategy at ``block_size`` in ``kv_memory_bytes`` of KV."""
    num_blocks = num_blocks_for_memory(kv_memory_bytes, config.model, block_size, hybrid=bool(config.cache.hybrid_kv))
    sized = replace(config, cache=replace(config.cache, block_size=block_size, num_blocks=num_blocks))
    metrics = replay(trace, sized, "paged", progress=progress)
    detail = metrics.detail
    assert detail is not None
    completed_finals = [r.total_tokens - 1 for r in trace.requests
                        if r.total_tokens <= sized.model_len and num_blocks_for(r.total_tokens - 1, block_size)
                        <= num_blocks]
    return ProfileRow(
        block_size=block_size,
        num_blocks=num_blocks,
        metrics=metrics,
        tail_waste_pct=tail_waste_pct(detail.unused_slot_time_s, detail.allocated_slot_time_s),
        mean_tail_waste_tokens=detail.mean_unused_slots_per_request,
        block_table_entries_per_sequence=float(np.mean([num_blocks_for(f, block_size) for f in completed_finals]))
        if completed_finals else 0.0,
        block_table_bytes=detail.peak_used_slots // block_size * BLOCK_TABLE_ENTRY_BYTES,
        num_block_allocations=detail.num_block_allocations,
        num_block_frees=detail.num_block_frees,
        prefix_tokens_lost=prefix_tokens_lost(trace, block_size),
        final_tail_waste=[tail_waste(f, block_size) for f in completed_finals],
    )


def time_kernels(backend: Backend, config: SimConfig, block_size: int, seq_lens: list[int], dtype: torch.dtype,
                 max_tokens: int | None, repeat: int, seed: int = 0) -> KernelCost:
    """Cache write and decode attention of one layer on a batch of ``seq_lens`` (scaled down, keeping their
    proportions, when they hold more than ``max_tokens``), blocks in random order."""
    import torch

    from minipaged_cli.dataplane.kernels import random_block_tables
    from minipaged_cli.dataplane.kv_cache import PagedKVCache

    model = config.model
    if max_tokens is not None and sum(seq_lens) > max_tokens:
        factor = max_tokens / sum(seq_lens)
        seq_lens = [max(1, int(length * factor)) for length in seq_lens]
    needed = [num_blocks_for(length, block_size) for length in seq_lens]
    num_blocks = sum(needed) + 1
    generator = torch.Generator().manual_seed(seed)
    device = backend.device
    cache = PagedKVCache(1, num_blocks, model.num_kv_heads, block_size, model.head_dim, dtype, device)
    for tensor in (cache.key_cache[0], cache.value_cache[0]):
        tensor.copy_(torch.randn(tensor.shape, generator=generator).to(dtype))
    block_tables = random_block_tables(seq_lens, num_blocks, block_size, generator).to(device)
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    query = torch.randn(len(seq_lens), model.num_q_heads, model.head_dim, generator=generator).to(dtype).to(device)
    scale = model.head_dim ** -0.5

    num_written = min(4096, cache.num_slots)
    slots = torch.randperm(cache.num_slots, generator=generator)[:num_written].to(torch.int64).to(device)
    key = torch.randn(num_written, model.num_kv_heads, model.head_dim, generator=generator).to(dtype).to(device)

    def write() -> None:
        backend.cache_write(key, key, cache.key_cache[0], cache.value_cache[0], slots)

    def attend() -> None:
        backend.paged_attention(query, cache.key_cache[0], cache.value_cache[0], block_tables, lens, scale)

    write_s = backend.median_seconds(write, repeat)
    attention_s = backend.median_seconds(attend, repeat)
    kv_bytes = 2 * sum(seq_lens) * model.num_kv_heads * model.head_dim * cache.key_cache[0].element_size()
    return KernelCost(cache_write_us_per_token=1e6 * write_s / num_written, attention_us=1e6 * attention_s,
                      attention_gbps=kv_bytes / attention_s / 1e9, batch=len(seq_lens), tokens=sum(seq_lens))


def recommend(rows: list[ProfileRow]) -> tuple[int, str]:
    """The block size to use, and why: among the sizes whose token-state share is within
    ``TOKEN_STATE_SLACK_PCT`` points of the best and that lose no more prefix reuse than the least, the one with
    the fastest attention (or, without kernel timings, the largest: the least metadata)."""
    best_state = max(r.metrics.token_state_pct for r in rows)
    close = [r for r in rows if r.metrics.token_state_pct >= best_state - TOKEN_STATE_SLACK_PCT]
    least_lost = min(r.prefix_tokens_lost for r in close)
    candidates = [r for r in close if r.prefix_tokens_lost == least_lost]
    timed = [r for r in candidates if r.kernel is not None]
    if timed:
        choice = min(timed, key=lambda r: r.kernel.attention_us)  # type: ignore[union-attr]
        speed = f"the fastest attention among them ({choice.kernel.attention_us:,.0f} µs)"  # type: ignore[union-attr]
    else:
        choice = max(candidates, key=lambda r: r.block_size)
        speed = "the largest of them (the shortest block tables)"
    reason = (f"token states {choice.metrics.token_state_pct:.1f} % (best {best_state:.1f} %; sizes within "
              f"{TOKEN_STATE_SLACK_PCT:g} point qualify: {', '.join(str(r.block_size) for r in candidates)}), "
              f"{speed}; tail waste {choice.mean_tail_waste_tokens:.1f} tokens a sequence"
              + (f", {choice.prefix_tokens_lost:,} prefix tokens lost" if choice.prefix_tokens_lost else ""))
    return choice.block_size, reason


def tail_waste_histogram(values: list[int], block_size: int, num_bins: int = 8) -> list[tuple[str, int]]:
    """Counts of the final tail waste in up to ``num_bins`` ranges of [0, block_size)."""
    width = max(1, math.ceil(block_size / num_bins))
    counts = np.bincount(np.asarray(values, dtype=np.int64) // width, minlength=math.ceil(block_size / width))
    return [(f"{i * width}-{min(block_size, (i + 1) * width) - 1}", int(c)) for i, c in enumerate(counts)]


@dataclass(frozen=True)
class OffloadCost:
    """Blocks of every layer's K and V stored to host memory and loaded back in one host layout
    (``dataplane.offload.LAYOUTS``): end-to-end GB/s of ``HostKVPool.store`` and ``load`` (gather or scatter,
    the copies, their synchronisation), median of the repeats."""

    block_size: int
    layout: str
    num_blocks: int  # moved each way per timed call
    copies_per_block: int  # 1 when contiguous across layers, 2 x num_layers per layer
    copy_bytes: int  # bytes of one copy
    store_gbps: float
    load_gbps: float

    def to_dict(self) -> dict[str, float | int | str]:
        return rounded({"block_size": self.block_size, "layout": self.layout, "num_blocks": self.num_blocks,
                        "copies_per_block": self.copies_per_block, "copy_bytes": self.copy_bytes,
                        "store_gbps": self.store_gbps, "load_gbps": self.load_gbps})


def time_offload(backend: Backend, model: ModelSpec, block_size: int, dtype: torch.dtype, num_layers: int,
                 transfer_bytes: int, repeat: int, seed: int = 0) -> list[OffloadCost]:
    """For each host layout: store about ``transfer_bytes`` of whole blocks (``num_layers`` layers) from a
    cache on ``backend``'s device to host memory, then load them into other blocks, ``repeat`` times after a
    warm-up; the median time of each direction. Small blocks make small copies: the per-layer layout makes
    2 x num_layers copies of one layer's block each, the contiguous layout one copy of every layer's."""
    import torch

    from minipaged_cli.dataplane.kv_cache import PagedKVCache
    from minipaged_cli.dataplane.offload import LAYOUTS, HostKVPool

    head_bytes = model.num_kv_heads * model.head_dim * torch.finfo(dtype).bits // 8  # K or V, one token, layer
    block_bytes = 2 * num_layers * block_size * head_bytes
    num_moved = max(1, transfer_bytes // block_bytes)
    cache = PagedKVCache(num_layers, 2 * num_moved, model.num_kv_heads, block_size, model.head_dim, dtype,
                         backend.device)
    generator = torch.Generator().manual_seed(seed)
    for tensor in (*cache.key_cache, *cache.value_cache):
        tensor.copy_(torch.randn(tensor.shape, generator=generator).to(dtype))
    stored = [(i, i) for i in range(num_moved)]  # (hash, block): the first half's blocks
    loaded = [(i, num_moved + i) for i in range(num_moved)]  # into the second half's
    costs = []
    for layout in LAYOUTS:
        pool = HostKVPool(cache, backend, num_moved, layout)
        seconds: dict[str, list[float]] = {"store": [], "load": []}
        for attempt in range(repeat + 1):  # the first is the warm-up
            for direction, move, pairs in (("store", pool.store, stored), ("load", pool.load, loaded)):
                pool.synchronize()
                backend.synchronize()
                start = time.perf_counter()
                transfer = move(pairs)
                pool.synchronize()
                backend.synchronize()
                if attempt:
                    seconds[direction].append(time.perf_counter() - start)
            pool.discard(h for h, _ in stored)
        store_s, load_s = (float(np.median(seconds[d])) for d in ("store", "load"))
        copies = transfer.num_copies // num_moved
        costs.append(OffloadCost(block_size=block_size, layout=layout, num_blocks=num_moved,
                                 copies_per_block=copies, copy_bytes=block_bytes // copies,
                                 store_gbps=num_moved * block_bytes / store_s / 1e9,
                                 load_gbps=num_moved * block_bytes / load_s / 1e9))
    return costs
