"""``minipaged run``'s engine: the simulator's paged replay, with the real work done on real tensors each step.

Every step the simulator decides (admissions, preemptions, prefill chunks, decodes) is executed on a
``PagedKVCache`` through a backend: blocks that copy-on-write duplicates are copied first (a trace with ``n`` > 1
forks samples that share their prompt's blocks), the K/V of every new token is written through its slot, and every
decoding sequence runs decode attention over its block table, in every layer. Q/K/V are random (seeded); there are no
weights: what is measured is the paged data plane.
"""

from __future__ import annotations

import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from minipaged_cli.apps.offload_steps import OffloadStats, StepOffload
from minipaged_cli.dataplane.backends import Backend
from minipaged_cli.dataplane.block_tables import padded_block_tables, slot_mapping
from minipaged_cli.dataplane.fp8 import cache_dtype
from minipaged_cli.dataplane.kv_cache import PagedKVCache
from minipaged_cli.dataplane.kv_scales import DEFAULT_SCALE_MODE
from minipaged_cli.memory.allocators import Allocator
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import StepWork, check_capacity, replay
from minipaged_cli.units import rounded
from minipaged_cli.workloads.trace import Trace

_RANDOM_TOKENS = 4096  # rows of random fused QKV that the steps cycle through


@dataclass
class RunReport:
    """What ``minipaged run`` measured; ``to_dict`` is its ``--json`` document (bytes per second in GB/s)."""

    device: str
    backend: str
    steps: int
    prompt_tokens: int
    decode_tokens: int
    wall_s: float
    attention_s: float
    cache_write_s: float
    attention_bytes: int
    cache_write_bytes: int
    token_state_pct: float  # the memory categories of ``simulate`` (``sim.categories``), same averaging
    kv_cache_usage_perc: float
    averaged_over: str  # "saturated" or "busy" steps, as in ``simulate``
    kv_pool_bytes: int
    peak_memory_bytes: int
    num_preemptions: int
    block_copies: int = 0  # copy-on-write block copies, each in every layer
    copy_s: float = 0.0
    offload: OffloadStats | None = None  # with a host tier: what its copies moved
    per_step: dict[str, list[float]] = field(default_factory=dict, repr=False)

    @property
    def decode_tokens_per_s(self) -> float:
        return self.decode_tokens / self.wall_s if self.wall_s else 0.0

    @property
    def attention_gbps(self) -> float:
        """K/V bytes decode attention read, per second of attention."""
        return self.attention_bytes / self.attention_s / 1e9 if self.attention_s else 0.0

    @property
    def cache_write_gbps(self) -> float:
        """K/V bytes the cache writes stored, per second of cache writes."""
        return self.cache_write_bytes / self.cache_write_s / 1e9 if self.cache_write_s else 0.0

    def to_dict(self) -> dict[str, Any]:
        return rounded({
            "device": self.device, "backend": self.backend, "steps": self.steps,
            "prompt_tokens": self.prompt_tokens, "decode_tokens": self.decode_tokens, "wall_s": self.wall_s,
            "decode_tokens_per_s": self.decode_tokens_per_s, "attention_s": self.attention_s,
            "cache_write_s": self.cache_write_s, "attention_gbps": self.attention_gbps,
            "cache_write_gbps": self.cache_write_gbps, "token_state_pct": self.token_state_pct,
            "kv_cache_usage_perc": self.kv_cache_usage_perc, "averaged_over": self.averaged_over,
            "kv_pool_bytes": self.kv_pool_bytes,
            "peak_memory_bytes": self.peak_memory_bytes, "num_preemptions": self.num_preemptions,
            "block_copies": self.block_copies, "copy_s": self.copy_s,
        }) | ({"offload": self.offload.to_dict()} if self.offload is not None else {})


class _Executor:
    """Executes each ``StepWork`` on the cache: the ``on_step`` of the simulator's replay."""

    def __init__(self, cache: PagedKVCache, backend: Backend, num_q_heads: int, seed: int,
                 dtype: torch.dtype | None = None, offload: StepOffload | None = None) -> None:
        """``dtype``: the queries' and new K/V's (None: the cache's, which must then not be fp8); ``offload``: the
        host tier's moves, when the simulator has one."""
        self.cache = cache
        self.backend = backend
        self.offload = offload
        _, self.num_kv_heads, self.block_size, self.head_dim = cache.shape
        self.num_q_heads = num_q_heads
        self.scale = self.head_dim ** -0.5
        generator = torch.Generator().manual_seed(seed)
        heads = num_q_heads + 2 * self.num_kv_heads
        # [tokens, q heads + 2 kv heads, head_dim], like a fused QKV projection: Q, K, V are strided views.
        self.qkv = torch.randn(_RANDOM_TOKENS, heads, self.head_dim, generator=generator).to(dtype or cache.dtype)
        self.qkv = self.qkv.to(cache.device)
        # K or V of one token in one layer, as stored: 1 byte an element in an fp8 cache.
        self.token_bytes = self.num_kv_heads * self.head_dim * cache.key_cache[0].element_size()
        self.cursor = 0
        self.steps = 0
        self.prompt_tokens = 0
        self.decode_tokens = 0
        self.attention_s = 0.0
        self.cache_write_s = 0.0
        self.attention_bytes = 0
        self.cache_write_bytes = 0
        self.block_copies = 0
        self.copy_s = 0.0
        self.per_step: dict[str, list[float]] = {"attention_ms": [], "cache_write_ms": [], "batch_size": [],
                                                 "live_tokens": []}

    def __call__(self, work: StepWork, allocator: Allocator) -> None:
        if self.offload is not None:
            self.offload.before_compute(work)
        if not (work.prefills or work.decodes or work.copies):  # (only copies to and from the host tier: no step)
            if self.offload is not None:
                self.offload.after_compute(work)
            return
        self._copy(work.copies)
        slot_mapping = self._slot_mapping(work, allocator)
        write_s = self._write(slot_mapping)
        attention_s = self._attend(work, allocator)
        if self.offload is not None:
            self.offload.after_compute(work)
        self.steps += 1
        self.prompt_tokens += sum(n for _, _, n in work.prefills)
        self.decode_tokens += len(work.decodes)
        for name, value in (("attention_ms", 1e3 * attention_s), ("cache_write_ms", 1e3 * write_s),
                            ("batch_size", len(work.decodes)), ("live_tokens", work.live_tokens)):
            self.per_step[name].append(value)

    def _slot_mapping(self, work: StepWork, allocator: Allocator) -> torch.Tensor:
        """[new tokens] int64: each prefill chunk's positions, then each decode's one position."""
        writes = [*work.prefills, *((sequence_id, position, 1) for sequence_id, position in work.decodes)]
        parts = [slot_mapping(allocator.block_table(sequence_id), self.block_size, np.arange(start, start + count))
                 for sequence_id, start, count in writes]
        slots = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        return torch.from_numpy(slots.astype(np.int64)).to(self.cache.device)

    def _copy(self, copies: list[tuple[int, int]]) -> None:
        """Copy-on-write: each (src, dst) block, in every layer, before any token is written."""
        if not copies:
            return
        mapping = torch.tensor(copies, dtype=torch.int64, device=self.cache.device)
        for layer in range(self.cache.num_layers):
            _, elapsed = self.backend.timed(lambda layer=layer: self.backend.copy_blocks(
                self.cache.key_cache[layer], self.cache.value_cache[layer], mapping))
            self.copy_s += elapsed
        self.block_copies += len(copies)

    def _rows(self, count: int) -> torch.Tensor:
        """``count`` (at most ``_RANDOM_TOKENS``) rows of the random QKV, cycling."""
        start = self.cursor if self.cursor + count <= _RANDOM_TOKENS else 0
        self.cursor = start + count
        return self.qkv[start:start + count]

    def _write(self, slot_mapping: torch.Tensor) -> float:
        seconds = 0.0
        q, kv = self.num_q_heads, self.num_kv_heads
        for first in range(0, len(slot_mapping), _RANDOM_TOKENS // 2):
            slots = slot_mapping[first:first + _RANDOM_TOKENS // 2]
            rows = self._rows(len(slots))
            key, value = rows[:, q:q + kv], rows[:, q + kv:]  # strided views of the fused QKV
            for layer in range(self.cache.num_layers):
                scales = self.cache.scales_for_write(layer, key, value)  # an fp8 cache's: fixed at the first write
                _, elapsed = self.backend.timed(lambda layer=layer, key=key, value=value, slots=slots, scales=scales:
                                                self.backend.cache_write(key, value, self.cache.key_cache[layer],
                                                                         self.cache.value_cache[layer], slots,
                                                                         *scales))
                seconds += elapsed
        self.cache_write_s += seconds
        self.cache_write_bytes += 2 * len(slot_mapping) * self.token_bytes * self.cache.num_layers
        return seconds

    def _attend(self, work: StepWork, allocator: Allocator) -> float:
        if not work.decodes:
            return 0.0
        sequence_ids = [s for s, _ in work.decodes]
        device = self.cache.device
        block_tables = padded_block_tables([allocator.block_table(s) for s in sequence_ids], as_torch=True).to(device)
        seq_lens = torch.tensor([p + 1 for _, p in work.decodes], dtype=torch.int32, device=device)
        query = self._rows(len(sequence_ids))[:, : self.num_q_heads]  # [batch, num_q_heads, head_dim]
        seconds = 0.0
        for layer in range(self.cache.num_layers):
            _, elapsed = self.backend.timed(lambda layer=layer: self.backend.paged_attention(
                query, self.cache.key_cache[layer], self.cache.value_cache[layer], block_tables, seq_lens,
                self.scale, *self.cache.scales(layer)))
            seconds += elapsed
        self.attention_s += seconds
        self.attention_bytes += 2 * int(seq_lens.sum()) * self.token_bytes * self.cache.num_layers
        return seconds


def run_trace(
    trace: Trace,
    config: SimConfig,
    backend: Backend,
    *,
    num_layers: int,
    dtype: torch.dtype,
    max_steps: int | None = None,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
    scale_mode: str = DEFAULT_SCALE_MODE,
) -> RunReport:
    """Replay ``trace`` with the paged strategy and execute every step on a cache of ``num_layers`` layers, of
    ``dtype`` or of the model's ``kv_cache_dtype`` when that is fp8 (its scales as ``scale_mode``).
    Bad input (``check_capacity``, as ``simulate``): no request fits ``max_model_len`` or the pool."""
    check_capacity(trace, config, ("paged",))
    model = config.model
    cache = PagedKVCache(num_layers, config.cache.num_blocks, model.num_kv_heads, config.block_size, model.head_dim,
                         cache_dtype(model.kv_cache_dtype, dtype), backend.device, scale_mode)
    offload = StepOffload.under(cache, backend, config.tiers) if config.tiers.has_tiers else None
    executor = _Executor(cache, backend, model.num_q_heads, seed, dtype, offload)
    if backend.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(backend.device)
    start = time.perf_counter()
    metrics = replay(trace, config, "paged", progress=progress, on_step=executor, max_steps=max_steps)
    backend.synchronize()
    wall = time.perf_counter() - start
    return RunReport(
        device=str(backend.device),
        backend=backend.name,
        steps=executor.steps,
        prompt_tokens=executor.prompt_tokens,
        decode_tokens=executor.decode_tokens,
        wall_s=wall,
        attention_s=executor.attention_s,
        cache_write_s=executor.cache_write_s,
        attention_bytes=executor.attention_bytes,
        cache_write_bytes=executor.cache_write_bytes,
        token_state_pct=metrics.token_state_pct,
        kv_cache_usage_perc=metrics.kv_cache_usage_perc,
        averaged_over=metrics.averaged_over,
        kv_pool_bytes=cache.memory_bytes,
        peak_memory_bytes=_peak_memory(backend),
        num_preemptions=metrics.num_preemptions,
        block_copies=executor.block_copies,
        copy_s=executor.copy_s,
        offload=offload.stats() if offload is not None else None,
        per_step=executor.per_step,
    )


def _peak_memory(backend: Backend) -> int:
    """The device's peak allocated bytes on CUDA; the process's peak resident set on the CPU."""
    if backend.device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(backend.device))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)  # macOS reports bytes, Linux KiB
