"""The CUDA kernels on a GPU: decode attention bandwidth and latency, cache-write bandwidth, against baselines
measured in the same run. Needs a GPU and PyCUDA (``pip install -e ".[gpu]"``); issue 8 runs it on the H200.

Decode attention, Qwen3-8B heads (32 q / 8 kv, head_dim 128), bf16, block 16, blocks permuted at random in a K/V
pool of several GB: B=32 x 4,096 tokens, B=1 x 1,024 (latency), B=64 x 512, and a skewed batch. Achieved
bandwidth = (K + V + Q + O + block-table bytes) / kernel time; CUDA events, median of --repeat (>= 20), L2
flushed between repetitions. Beside it: torch SDPA on the same K/V stored contiguously (enable_gqa), gather + SDPA
(index_select of the blocks, then SDPA), and a device-to-device copy of the same K/V bytes (the practical
ceiling). Cache write: GB/s at 16,384 tokens and microseconds at 64.

Goals (issue 4): attention >= 3.4 TB/s at B=32 x 4,096 on an H200 and at least as fast as contiguous SDPA;
<= 10 us at B=1 x 1,024; cache write >= 70 % of the copy ceiling at 16,384 tokens.

    python benchmarks/kernels_gpu.py [--repeat 50] [--pool-gib 8]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable

import torch
import torch.nn.functional as F

from minipaged_cli.cuda_backend import CudaBackend, cuda_backend_unavailable_reason
from minipaged_cli.kernels import random_block_tables

NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, DTYPE = 32, 8, 128, 16, torch.bfloat16
CASES = {
    "B=32 x 4096": [4096] * 32,
    "B=1 x 1024": [1024],
    "B=64 x 512": [512] * 64,
    "skewed (32 seqs, 131,072 tokens)": [32768, 16384, 8192, 8192, 4096, 4096] + [2048] * 26 + [2048 - 6],
}


def median_time(call: Callable[[], object], repeat: int, flush: torch.Tensor) -> float:
    """Median seconds of ``call`` between CUDA events, with the L2 cache flushed before each repetition."""
    call()
    times = []
    for _ in range(repeat):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def attention_case(name: str, lengths: list[int], backend: CudaBackend, key_cache: torch.Tensor,
                   value_cache: torch.Tensor, generator: torch.Generator, repeat: int, flush: torch.Tensor) -> None:
    device, element = backend.device, key_cache.element_size()
    num_blocks, batch, scale = key_cache.shape[0], len(lengths), HEAD_DIM ** -0.5
    block_tables = random_block_tables(lengths, num_blocks, BLOCK_SIZE, generator).to(device)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=device)
    query = torch.randn(batch, NUM_Q_HEADS, HEAD_DIM, device=device, dtype=DTYPE)
    max_len = max(lengths)
    kernel_s = median_time(lambda: backend.launch_attention(query, key_cache, value_cache, block_tables, seq_lens,
                                                            scale, max_len), repeat, flush)
    kv_bytes = 2 * sum(lengths) * NUM_KV_HEADS * HEAD_DIM * element
    moved = kv_bytes + 2 * query.numel() * element + block_tables.numel() * 4
    # The same K/V bytes copied (read + write): the practical ceiling.
    source = torch.empty(kv_bytes // element, device=device, dtype=DTYPE)
    target = torch.empty_like(source)
    copy_tbps = 2 * kv_bytes / median_time(lambda: target.copy_(source), repeat, flush) / 1e12
    sdpa_s = gather_s = float("nan")
    if len(set(lengths)) == 1:  # SDPA takes equal lengths without padding
        keys = torch.randn(batch, NUM_KV_HEADS, max_len, HEAD_DIM, device=device, dtype=DTYPE)
        values = torch.randn_like(keys)
        q4 = query[:, :, None, :]
        sdpa_s = median_time(lambda: F.scaled_dot_product_attention(q4, keys, values, scale=scale, enable_gqa=True),
                             repeat, flush)
        ids = block_tables.reshape(-1).long()

        def gather_sdpa() -> torch.Tensor:
            k = key_cache.index_select(0, ids).view(batch, -1, NUM_KV_HEADS, BLOCK_SIZE, HEAD_DIM)
            v = value_cache.index_select(0, ids).view(batch, -1, NUM_KV_HEADS, BLOCK_SIZE, HEAD_DIM)
            k = k.permute(0, 2, 1, 3, 4).reshape(batch, NUM_KV_HEADS, -1, HEAD_DIM)
            v = v.permute(0, 2, 1, 3, 4).reshape(batch, NUM_KV_HEADS, -1, HEAD_DIM)
            return F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True)

        gather_s = median_time(gather_sdpa, repeat, flush)
    tbps = moved / kernel_s / 1e12
    print(f"{name:34} {kernel_s * 1e6:>10.1f} {tbps:>7.2f} {sdpa_s * 1e6:>9.1f} {gather_s * 1e6:>15.1f} "
          f"{copy_tbps:>10.2f} {sdpa_s / kernel_s:>7.2f}x {tbps / copy_tbps:>7.0%}")


def cache_write_case(tokens: int, backend: CudaBackend, key_cache: torch.Tensor, value_cache: torch.Tensor,
                     generator: torch.Generator, repeat: int, flush: torch.Tensor) -> None:
    device, element = backend.device, key_cache.element_size()
    qkv = torch.randn(tokens, NUM_Q_HEADS + 2 * NUM_KV_HEADS, HEAD_DIM, device=device, dtype=DTYPE)
    key, value = qkv[:, NUM_Q_HEADS:NUM_Q_HEADS + NUM_KV_HEADS], qkv[:, NUM_Q_HEADS + NUM_KV_HEADS:]
    num_slots = key_cache.shape[0] * BLOCK_SIZE
    slots = torch.randperm(num_slots, generator=generator)[:tokens].to(torch.int64).to(device)
    write_s = median_time(lambda: backend._cache_write(key, value, key_cache, value_cache, slots), repeat, flush)
    written = 2 * tokens * NUM_KV_HEADS * HEAD_DIM * element
    source = torch.empty(written // element, device=device, dtype=DTYPE)
    target = torch.empty_like(source)
    copy_s = median_time(lambda: target.copy_(source), repeat, flush)
    print(f"{tokens:>6} tokens: {write_s * 1e6:8.1f} us, {2 * written / write_s / 1e9:8.1f} GB/s moved (read + "
          f"write); a copy of the same bytes {2 * written / copy_s / 1e9:8.1f} GB/s: {copy_s / write_s:.0%} of it")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=50)
    parser.add_argument("--pool-gib", type=float, default=8.0)
    args = parser.parse_args()
    reason = cuda_backend_unavailable_reason()
    if reason is not None:
        raise SystemExit(f"kernels_gpu.py needs the CUDA backend: {reason}")
    backend = CudaBackend()
    device = backend.device
    properties = torch.cuda.get_device_properties(device)
    print(f"{properties.name}, {properties.multi_processor_count} SMs, {properties.total_memory / 2**30:.0f} GiB; "
          f"torch {torch.__version__}, CUDA {torch.version.cuda}; repeat {args.repeat}")
    flush = torch.empty(256 * 2**20, dtype=torch.uint8, device=device)  # larger than any L2
    block_bytes = NUM_KV_HEADS * BLOCK_SIZE * HEAD_DIM * torch.tensor([], dtype=DTYPE).element_size()
    num_blocks = int(args.pool_gib * 2**30 / (2 * block_bytes))
    key_cache = torch.randn(num_blocks, NUM_KV_HEADS, BLOCK_SIZE, HEAD_DIM, device=device, dtype=DTYPE)
    value_cache = torch.randn_like(key_cache)
    generator = torch.Generator(device="cpu").manual_seed(0)

    print(f"\ndecode attention ({NUM_Q_HEADS} q / {NUM_KV_HEADS} kv heads, head_dim {HEAD_DIM}, bf16, block "
          f"{BLOCK_SIZE}, pool {num_blocks * 2 * block_bytes / 2**30:.1f} GiB)")
    print(f"{'case':34} {'kernel us':>10} {'TB/s':>7} {'SDPA us':>9} {'gather+SDPA us':>15} {'copy TB/s':>10} "
          f"{'vs SDPA':>8} {'vs copy':>8}")
    for name, lengths in CASES.items():
        attention_case(name, lengths, backend, key_cache, value_cache, generator, args.repeat, flush)
    print("\ncache write (bf16, 8 kv heads, head_dim 128, slots permuted)")
    for tokens in (16384, 64):
        cache_write_case(tokens, backend, key_cache, value_cache, generator, args.repeat, flush)


if __name__ == "__main__":
    main()
