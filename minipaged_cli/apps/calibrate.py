"""``minipaged calibrate``: the step-time tables of ``sim/calibration.py``, measured or converted.

Measured: one layer of the model, random weights and K/V from a fixed seed, on the data plane's device. The
weight GEMMs are torch's (what an engine runs), and so are the element-wise kernels (two RMSNorms, RoPE on Q and
K, the activation, a residual add: unfused, as Vidur profiles them); decode attention and cache writes are this
project's kernels (``--device`` picks them, as for ``run``); prefill attention is torch's
``scaled_dot_product_attention`` with a causal mask (an engine's flash-attention prefill; this project has no
prefill kernel). Each point is the median of ``repeat`` timed calls after untimed warm-up calls
(``Backend.median_seconds``): what a first call pays is not in the tables. The full grid runs prompts
and contexts up to the model's context length; prefill stops early where the device runs out of memory (the
calibration's ``source`` says where), and :func:`coverage` lists every table that ends short of the context.

Converted: a profile of Microsoft's Vidur simulator (``data/profiling/compute/<gpu>/<model>/mlp.csv``): its
weight GEMMs and element-wise kernels.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import torch

from minipaged_cli.dataplane.backends import Backend
from minipaged_cli.dataplane.kernels import random_block_tables
from minipaged_cli.dataplane.kv_cache import PagedKVCache
from minipaged_cli.sim.calibration import Calibration, Grid, Table
from minipaged_cli.sim.config import DEFAULT_BLOCK_SIZE
from minipaged_cli.workloads.presets import ModelSpec


@dataclass(frozen=True)
class CalibrationGrid:
    linear_tokens: tuple[int, ...]
    elementwise_tokens: tuple[int, ...]
    prefill_tokens: tuple[int, ...]
    decode_batch: tuple[int, ...]
    decode_context: tuple[int, ...]
    write_tokens: tuple[int, ...]
    block_size: int = DEFAULT_BLOCK_SIZE


# A GPU's: GEMM times step at tile boundaries, so every 8 tokens up to 1,024 (as Vidur profiles), then every 64.
FULL_GRID = CalibrationGrid(
    linear_tokens=(1, 2, 4, *range(8, 1024, 8), *range(1024, 8193, 64)),
    elementwise_tokens=tuple(2 ** i for i in range(14)),  # memory-bound, smooth: 1-8,192
    prefill_tokens=(16, 64, 128, 256, 512, 1024, 2048, 4096, 8192),
    decode_batch=(1, 2, 4, 8, 16, 32, 64, 128, 256),
    decode_context=(16, 64, 256, 1024, 4096, 8192),
    write_tokens=(1, 16, 64, 256, 1024, 4096, 16384),
)
# A CPU's, or a first look: minutes become seconds.
QUICK_GRID = CalibrationGrid(
    linear_tokens=(1, 8, 64, 256),
    elementwise_tokens=(1, 64),
    prefill_tokens=(16, 128),
    decode_batch=(1, 4),
    decode_context=(16, 128),
    write_tokens=(1, 64),
)
# The K/V pool decode attention reads from, at most: far beyond any L2 cache, so a batch longer than the pool
# shares its blocks among sequences (each sequence's own are distinct) and still reads every byte from HBM.
MAX_POOL_BYTES = 8 * 2 ** 30


def full_grid(model: ModelSpec) -> CalibrationGrid:
    """FULL_GRID with its prompts and contexts doubled on up to the model's context length (its last point), so
    no simulated prompt or context has to be extrapolated."""
    return replace(FULL_GRID, prefill_tokens=_up_to(FULL_GRID.prefill_tokens, model.max_model_len),
                   decode_context=_up_to(FULL_GRID.decode_context, model.max_model_len))


def _up_to(points: tuple[int, ...], length: int) -> tuple[int, ...]:
    if length <= points[-1]:
        return points
    longer, doubled = [], points[-1] * 2
    while doubled < length:
        longer.append(doubled)
        doubled *= 2
    return (*points, *longer, length)


def coverage(calibration: Calibration) -> list[str]:
    """The tables that end short of the measured model's context length, each with its last point: past it the
    simulator follows the efficiency model's shape."""
    length = calibration.model.max_model_len
    short = [(name, table.sizes[-1]) for name in ("prefill_attention", "cache_write")
             if (table := getattr(calibration, name)) is not None and table.sizes[-1] < length]
    grid = calibration.decode_attention
    if grid is not None and grid.context[-1] < length:
        short.append(("decode_attention", grid.context[-1]))
    return [f"{name} measured up to {int(last):,} tokens of the model's {length:,}: longer ones follow the "
            "efficiency model's shape" for name, last in short]


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

    elementwise = []
    norm_weight = randn(hidden)
    for tokens in grid.elementwise_tokens:
        if progress:
            progress(f"element-wise kernels, {tokens} tokens")
        x, residual = randn(tokens, hidden), randn(tokens, hidden)
        gate, up = randn(tokens, model.intermediate_size), randn(tokens, model.intermediate_size)
        q, k = randn(tokens, model.num_q_heads, model.head_dim), randn(tokens, model.num_kv_heads, model.head_dim)
        cos, sin = randn(tokens, 1, model.head_dim), randn(tokens, 1, model.head_dim)
        elementwise.append(median_seconds(lambda x=x, r=residual, g=gate, u=up, q=q, k=k, c=cos, s=sin: (
            _rms_norm(x, norm_weight), _rms_norm(r, norm_weight), _rope(q, c, s), _rope(k, c, s),
            _activation(g, u, model.gated_mlp), x + r)))
        del x, residual, gate, up, q, k, cos, sin

    prefill, stopped = [], ""
    for tokens in grid.prefill_tokens:
        if progress:
            progress(f"prefill attention, {tokens} tokens")
        try:
            q = randn(1, model.num_q_heads, tokens, model.head_dim)
            k, v = (randn(1, model.num_kv_heads, tokens, model.head_dim) for _ in range(2))
            prefill.append(median_seconds(lambda q=q, k=k, v=v: torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=True, enable_gqa=True)))
        except torch.cuda.OutOfMemoryError:
            stopped = f"; prefill attention stopped at {tokens:,} tokens: out of device memory"
            break
        finally:
            q = k = v = None  # free them before the next, longer prompt
        if device.type == "cuda":
            torch.cuda.empty_cache()

    block_size = grid.block_size
    pool_tokens = MAX_POOL_BYTES // (2 * model.num_kv_heads * model.head_dim * torch.finfo(dtype).bits // 8)
    most_tokens = min(max(max(grid.decode_batch) * max(grid.decode_context), max(grid.write_tokens)), pool_tokens)
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
            if batch * -(-context // block_size) <= num_blocks:
                tables = random_block_tables(lens, num_blocks, block_size, cpu_generator).to(device)
            else:  # longer than the pool: each sequence's blocks distinct, shared among sequences
                tables = torch.cat([random_block_tables([context], num_blocks, block_size, cpu_generator)
                                    for _ in range(batch)]).to(device)
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
        source=f"minipaged calibrate on {device_name(device)} with the {backend.name} backend, {dtype}, one "
               f"layer, median of {repeat}{stopped}",
        linear=table(grid.linear_tokens, linear), elementwise=table(grid.elementwise_tokens, elementwise),
        prefill_attention=table(grid.prefill_tokens[:len(prefill)], prefill),
        decode_attention=Grid(np.asarray(grid.decode_batch, dtype=np.float64),
                              np.asarray(grid.decode_context, dtype=np.float64), decode),
        cache_write=table(grid.write_tokens, writes))


def _rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """[tokens, hidden]: Llama's RMSNorm as Hugging Face writes it (in float32, then back)."""
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * weight


def _rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """[tokens, heads, head_dim] rotated by [tokens, 1, head_dim] cos and sin (the rotate-half form)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


def _activation(gate: torch.Tensor, up: torch.Tensor, gated: bool) -> torch.Tensor:
    """[tokens, intermediate]: SiLU(gate) * up, or a plain MLP's activation of its one input."""
    if gated:
        return torch.nn.functional.silu(gate) * up
    return torch.nn.functional.gelu(gate)


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return str(device)
