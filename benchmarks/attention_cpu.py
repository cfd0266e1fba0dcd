"""The cost of paging on the CPU: decode paged attention against SDPA on the same K/V stored contiguously.

Shape (the issue's): batch 8, 16 query / 8 kv heads, head_dim 128, context 2,048, fp32, block size 16, every
sequence's blocks a random permutation of the pool. Baselines measured in the same run:
``torch.nn.functional.scaled_dot_product_attention`` on contiguous K/V (enable_gqa), and a memory copy of the
same bytes (this machine's bandwidth ceiling, read + write). Goal: the best paged implementation within 1.5x of
contiguous SDPA.

    python benchmarks/attention_cpu.py [--repeat 20] [--context 2048] [--batch 8]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from minipaged_cli.dataplane.reference import paged_attention_online, paged_attention_vectorized

GOAL = 1.5


def best_time(call: Callable[[], object], repeat: int) -> float:
    """Median of ``repeat`` timed calls after two warm-ups, in seconds."""
    call()
    call()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return sorted(times)[len(times) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--context", type=int, default=2048)
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()
    batch, num_q_heads, num_kv_heads, head_dim = args.batch, 16, 8, 128
    block_size, context = args.block_size, args.context

    generator = torch.Generator().manual_seed(0)
    num_read = -(-context // block_size)
    num_blocks = batch * num_read
    key_cache = torch.randn(num_blocks, num_kv_heads, block_size, head_dim, generator=generator)
    value_cache = torch.randn(num_blocks, num_kv_heads, block_size, head_dim, generator=generator)
    block_tables = torch.randperm(num_blocks, generator=generator).to(torch.int32).view(batch, num_read)
    seq_lens = torch.full((batch,), context, dtype=torch.int32)
    query = torch.randn(batch, num_q_heads, head_dim, generator=generator)
    scale = head_dim ** -0.5

    # The same K/V, contiguous per sequence: [batch, kv heads, context, head_dim]
    blocks = block_tables.long()
    keys = key_cache[blocks].permute(0, 2, 1, 3, 4).reshape(batch, num_kv_heads, -1, head_dim)[:, :, :context]
    values = value_cache[blocks].permute(0, 2, 1, 3, 4).reshape(batch, num_kv_heads, -1, head_dim)[:, :, :context]
    keys, values = keys.contiguous(), values.contiguous()
    q4 = query[:, :, None, :]

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(q4, keys, values, scale=scale, enable_gqa=True)[:, :, 0]

    expected = sdpa()
    candidates = {
        "paged vectorized": lambda: paged_attention_vectorized(query, key_cache, value_cache, block_tables,
                                                               seq_lens, scale),
        "paged online, 1 block/tile": lambda: paged_attention_online(query, key_cache, value_cache, block_tables,
                                                                     seq_lens, scale),
        "paged online, 16 blocks/tile": lambda: paged_attention_online(query, key_cache, value_cache, block_tables,
                                                                       seq_lens, scale, blocks_per_tile=16),
    }
    for name, call in candidates.items():
        torch.testing.assert_close(call(), expected, rtol=2e-5, atol=2e-5, msg=lambda m, n=name: f"{n}: {m}")

    kv_bytes = 2 * keys.numel() * keys.element_size()
    source, target = torch.cat([keys.flatten(), values.flatten()]), torch.empty(keys.numel() * 2)
    copy_s = best_time(lambda: target.copy_(source), args.repeat)
    sdpa_s = best_time(sdpa, args.repeat)
    print(f"batch {batch}, {num_q_heads} q / {num_kv_heads} kv heads, head_dim {head_dim}, context {context}, "
          f"block {block_size}, fp32, {torch.get_num_threads()} threads; K/V {kv_bytes / 2**20:.0f} MiB")
    print(f"copy ceiling (read + write of the K/V bytes): {copy_s * 1e3:.2f} ms, "
          f"{2 * kv_bytes / copy_s / 1e9:.1f} GB/s moved")
    print(f"{'implementation':30} {'ms':>8} {'K/V GB/s':>9} {'vs SDPA':>8}")
    print(f"{'SDPA, contiguous K/V':30} {sdpa_s * 1e3:>8.2f} {kv_bytes / sdpa_s / 1e9:>9.1f} {1.0:>7.2f}x")
    best = None
    for name, call in candidates.items():
        seconds = best_time(call, args.repeat)
        best = min(best or seconds, seconds)
        print(f"{name:30} {seconds * 1e3:>8.2f} {kv_bytes / seconds / 1e9:>9.1f} {seconds / sdpa_s:>7.2f}x")
    verdict = "met" if best / sdpa_s <= GOAL else "NOT met"
    print(f"best paged / SDPA = {best / sdpa_s:.2f}x (goal <= {GOAL}x: {verdict})")


if __name__ == "__main__":
    main()
