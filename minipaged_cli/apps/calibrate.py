"""``minipaged calibrate``: the step-time tables of ``sim/calibration.py``, measured or converted.

Measured: one layer of the model, random weights and K/V from a fixed seed, on the data plane's device. The
weight GEMMs are torch's (what an engine runs); decode attention and cache writes are this project's kernels
(``--device`` picks them, as for ``run``); prefill attention is torch's ``scaled_dot_product_attention`` with a
causal mask (an engine's flash-attention prefill; this project has no prefill kernel). Each point is the median
of ``repeat`` timed calls after a warm-up.

Converted: a linear-layer profile of Microsoft's Vidur simulator (``data/profiling/compute/<gpu>/<model>/mlp.csv``).
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from minipaged_cli.dataplane.backends import Backend
from minipaged_cli.dataplane.kernels import random_block_tables
from minipaged_cli.dataplane.kv_cache import PagedKVCache
from minipaged_cli.errors import InputError
from minipaged_cli.sim.calibration import Calibration, Grid, Table
from minipaged_cli.workloads.presets import ModelSpec

VIDUR_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")  # QKV, O, gate+up, down


@dataclass(frozen=True)
class CalibrationGrid:
    linear_tokens: tuple[int, ...]
    prefill_tokens: tuple[int, ...]
    decode_batch: tuple[int, ...]
    decode_context: tuple[int, ...]
    write_tokens: tuple[int, ...]
    block_size: int = 16


# A GPU's: GEMM times step at tile boundaries, so every 8 tokens up to 1,024 (as Vidur profiles), then every 64.
FULL_GRID = CalibrationGrid(
    linear_tokens=(1, 2, 4, *range(8, 1024, 8), *range(1024, 8193, 64)),
    prefill_tokens=(16, 64, 128, 256, 512, 1024, 2048, 4096, 8192),
    decode_batch=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    decode_context=(16, 64, 256, 1024, 4096, 8192),
    write_tokens=(1, 16, 64, 256, 1024, 4096, 16384),
)
# A CPU's, or a first look: minutes become seconds.
QUICK_GRID = CalibrationGrid(
    linear_tokens=(1, 8, 64, 256),
    prefill_tokens=(16, 128),
    decode_batch=(1, 4),
    decode_context=(16, 128),
    write_tokens=(1, 64),
)


def from_vidur(path: Path, model: ModelSpec, gpu: str) -> Calibration:
    """The ``linear`` table of a Vidur ``mlp.csv`` (tensor parallelism 1; the median of each op, in ms)."""
    columns = [f"time_stats.{op}.median" for op in VIDUR_OPS]
    source = str(path)
    try:
        with open(path, newline="") as file:
            rows = list(csv.DictReader(file))
    except OSError as error:
        raise InputError(f"cannot read: {error.strerror}", source=source, field="--from-vidur") from None
    for column in (*columns, "num_tokens"):
        if not rows or column not in rows[0]:
            raise InputError("missing column (expected Vidur's mlp.csv)", source=source, field=column)
    times: dict[int, list[float]] = {}
    for i, row in enumerate(rows):
        if row.get("num_tensor_parallel_workers", "1") != "1":
            continue
        try:
            tokens = int(row["num_tokens"])
            seconds = sum(float(row[c]) for c in columns) / 1e3
        except ValueError:
            raise InputError("not a number", source=source, where=f"row {i + 2}",
                             field=next(c for c in (*columns, "num_tokens") if not _is_number(row[c])),
                             ) from None
        times.setdefault(tokens, []).append(seconds)
    if not times:
        raise InputError("no rows with num_tensor_parallel_workers 1", source=source)
    sizes = np.array(sorted(times), dtype=np.float64)
    return Calibration(gpu=gpu, model=model, path=source,
                       source=f"the linear layers of Vidur's profile {path.name} (microsoft/vidur, MIT), "
                              f"tensor parallelism 1, median of each op; the median of repeated rows",
                       linear=Table(sizes, np.array([float(np.median(times[int(s)])) for s in sizes])))


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


def measure(model: ModelSpec, gpu: str, backend: Backend, dtype: torch.dtype, grid: CalibrationGrid,
            repeat: int, seed: int = 0, progress: Callable[[str], None] | None = None) -> Calibration:
    """Time one layer of ``model`` over ``grid`` on ``backend``'s device."""
    generator = torch.Generator(device=backend.device).manual_seed(seed)
    device = backend.device

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=generator, device=device).to(dtype)

    def median_seconds(call: Callable[[], object]) -> float:
        return backend.median_seconds(call, repeat)

    hidden, q_width = model.hidden_size, model.num_q_heads * model.head_dim
    kv_width = model.num_kv_heads * model.head_dim
    mlp_in = (2 if model.gated_mlp else 1) * model.intermediate_size
    weights = [randn(q_width + 2 * kv_width, hidden), randn(hidden, q_width), randn(mlp_in, hidden),
               randn(hidden, model.intermediate_size)]
    linear = []
    for tokens in grid.linear_tokens:
        if progress:
            progress(f"linear layers, {tokens} tokens")
        inputs = [randn(tokens, w.shape[1]) for w in weights]
        linear.append(median_seconds(lambda inputs=inputs: [torch.nn.functional.linear(x, w)
                                                            for x, w in zip(inputs, weights, strict=True)]))

    prefill = []
    for tokens in grid.prefill_tokens:
        if progress:
            progress(f"prefill attention, {tokens} tokens")
        q = randn(1, model.num_q_heads, tokens, model.head_dim)
        k, v = (randn(1, model.num_kv_heads, tokens, model.head_dim) for _ in range(2))
        prefill.append(median_seconds(lambda q=q, k=k, v=v: torch.nn.functional.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=True)))
        del q, k, v

    block_size = grid.block_size
    most_tokens = max(max(grid.decode_batch) * max(grid.decode_context), max(grid.write_tokens))
    num_blocks = -(-most_tokens // block_size) + 1
    cache = PagedKVCache(1, num_blocks, model.num_kv_heads, block_size, model.head_dim, dtype, device)
    key_cache, value_cache = cache.key_cache[0], cache.value_cache[0]
    for tensor in (key_cache, value_cache):
        tensor.copy_(randn(*tensor.shape))
    scale = model.head_dim ** -0.5
    cpu_generator = torch.Generator().manual_seed(seed)
    decode = np.zeros((len(grid.decode_batch), len(grid.decode_context)))
    for i, batch in enumerate(grid.decode_batch):
        for j, context in enumerate(grid.decode_context):
            if progress:
                progress(f"decode attention, batch {batch} x {context} tokens")
            lens = [context] * batch
            tables = random_block_tables(lens, num_blocks, block_size, cpu_generator).to(device)
            seq_lens = torch.tensor(lens, dtype=torch.int32, device=device)
            query = randn(batch, model.num_q_heads, model.head_dim)
            decode[i, j] = median_seconds(lambda q=query, t=tables, s=seq_lens: backend.paged_attention(
                q, key_cache, value_cache, t, s, scale))

    writes = []
    for tokens in grid.write_tokens:
        if progress:
            progress(f"cache writes, {tokens} tokens")
        slots = torch.randperm(cache.num_slots, generator=cpu_generator)[:tokens].to(torch.int64).to(device)
        key = randn(tokens, model.num_kv_heads, model.head_dim)
        writes.append(median_seconds(lambda k=key, s=slots: backend.cache_write(k, k, key_cache, value_cache, s)))

    def table(sizes: tuple[int, ...], seconds: list[float]) -> Table:
        return Table(np.asarray(sizes, dtype=np.float64), np.asarray(seconds))

    return Calibration(
        gpu=gpu, model=model,
        source=f"minipaged calibrate on {_device_name(device)} with the {backend.name} backend, {dtype}, one "
               f"layer, median of {repeat}",
        linear=table(grid.linear_tokens, linear), prefill_attention=table(grid.prefill_tokens, prefill),
        decode_attention=Grid(np.asarray(grid.decode_batch, dtype=np.float64),
                              np.asarray(grid.decode_context, dtype=np.float64), decode),
        cache_write=table(grid.write_tokens, writes))


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return str(device)
