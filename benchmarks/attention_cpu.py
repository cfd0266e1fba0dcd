"""The cost of paging on the CPU: decode paged attention against SDPA on the same K/V stored contiguously, and
``minipaged run``'s own decode attention against the best paged implementation on the shape it runs.

Cases (``--case``):

- ``uniform``: batch 8, 16 query / 8 kv heads, head_dim 128, context 2,048, block size 16, every sequence's
  blocks a random permutation of the pool;
- ``run``: the shape ``minipaged run traces/mixed.yaml`` attends to at its busiest step (Qwen3-8B's 32 / 8
  heads, the simulator's busiest batch at the run's defaults: long, uneven contexts), blocks in random order.

Each at every ``--dtype`` (float32, bfloat16). Baselines measured in the same run: SDPA on contiguous K/V
(enable_gqa) and a memory copy of the same bytes (read + write: this machine's bandwidth ceiling). Goal: the best
paged implementation within 1.5x of contiguous SDPA. With ``--run``, also ``minipaged run traces/mixed.yaml`` at
each dtype (its defaults: 2 layers, 4 GiB, 200 steps) and its decode attention's K/V GB/s against the best paged
on the run case; goal: at least 1 / 1.5 of it.

    python benchmarks/attention_cpu.py [--dtype float32,bfloat16] [--case uniform,run] [--run] [--repeat 20]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from minipaged_cli.dataplane.kernels import random_block_tables
from minipaged_cli.dataplane.native import paged_attention_native
from minipaged_cli.dataplane.reference import paged_attention_online, paged_attention_vectorized

ROOT = Path(__file__).resolve().parent.parent
GOAL = 1.5
MIXED = ROOT / "traces" / "mixed.yaml"


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


def run_shape() -> tuple[list[int], int, int]:
    """(sequence lengths, q heads, kv heads) of the busiest step of ``minipaged run traces/mixed.yaml``."""
    from minipaged_cli.cli.run import CPU_KV_MEMORY
    from minipaged_cli.sim.config import SimConfig, num_blocks_for_memory
    from minipaged_cli.sim.replay import replay
    from minipaged_cli.units import parse_bytes
    from minipaged_cli.workloads.presets import load_gpu, load_model
    from minipaged_cli.workloads.readers import load_trace

    model = load_model("qwen3-8b")
    config = SimConfig.of(model, load_gpu("h200"), num_blocks_for_memory(parse_bytes(CPU_KV_MEMORY), model, 16))
    metrics = replay(load_trace(MIXED), config, "paged")
    assert metrics.detail is not None
    return metrics.detail.busiest_seq_lens, model.num_q_heads, model.num_kv_heads


def measure_case(name: str, lengths: list[int], num_q_heads: int, num_kv_heads: int, dtype: torch.dtype,
                 block_size: int, repeat: int) -> float:
    """Print one case's table; return the best paged K/V GB/s."""
    head_dim, batch = 128, len(lengths)
    generator = torch.Generator().manual_seed(0)
    needed = [-(-n // block_size) for n in lengths]
    num_blocks = sum(needed)
    key_cache = torch.randn(num_blocks, num_kv_heads, block_size, head_dim, generator=generator).to(dtype)
    value_cache = torch.randn(num_blocks, num_kv_heads, block_size, head_dim, generator=generator).to(dtype)
    block_tables = random_block_tables(lengths, num_blocks, block_size, generator)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    query = torch.randn(batch, num_q_heads, head_dim, generator=generator).to(dtype)
    scale = head_dim ** -0.5

    # The same K/V, contiguous per sequence: [kv heads, length, head_dim] each, SDPA one sequence at a time
    # when lengths differ (padding would add reads).
    def contiguous(cache: torch.Tensor, row: int) -> torch.Tensor:
        blocks = block_tables[row, :needed[row]].long()
        return cache[blocks].permute(1, 0, 2, 3).reshape(num_kv_heads, -1, head_dim)[:, :lengths[row]].contiguous()

    keys = [contiguous(key_cache, row) for row in range(batch)]
    values = [contiguous(value_cache, row) for row in range(batch)]

    def sdpa() -> torch.Tensor:
        return torch.stack([F.scaled_dot_product_attention(query[row, :, None, :][None], keys[row][None],
                                                           values[row][None], scale=scale, enable_gqa=True)[0, :, 0]
                            for row in range(batch)])

    expected = sdpa().float()
    candidates = {
        "paged native (C++, one pass)": lambda: paged_attention_native(query, key_cache, value_cache, block_tables,
                                                                       seq_lens, scale),
        "paged vectorized": lambda: paged_attention_vectorized(query, key_cache, value_cache, block_tables,
                                                               seq_lens, scale),
        "paged online, 16 blocks/tile": lambda: paged_attention_online(query, key_cache, value_cache, block_tables,
                                                                       seq_lens, scale, blocks_per_tile=16),
    }
    tolerance = 2e-5 if dtype == torch.float32 else 2e-2
    for label, call in candidates.items():
        torch.testing.assert_close(call().float(), expected, rtol=tolerance, atol=tolerance,
                                   msg=lambda m, n=label: f"{n}: {m}")

    kv_bytes = 2 * sum(lengths) * num_kv_heads * head_dim * key_cache.element_size()
    flat = torch.cat([k.flatten() for k in keys] + [v.flatten() for v in values])
    target = torch.empty_like(flat)
    copy_s = best_time(lambda: target.copy_(flat), repeat)
    sdpa_s = best_time(sdpa, repeat)
    dtype_name = str(dtype).removeprefix("torch.")
    print(f"\n{name}: batch {batch} (lengths {', '.join(map(str, lengths[:8]))}{' ...' if batch > 8 else ''}), "
          f"{num_q_heads} q / {num_kv_heads} kv heads, head_dim {head_dim}, block {block_size}, {dtype_name}, "
          f"{torch.get_num_threads()} threads; K/V {kv_bytes / 2**20:.0f} MiB")
    print(f"copy ceiling (read + write of the K/V bytes): {copy_s * 1e3:.2f} ms, {2 * kv_bytes / copy_s / 1e9:.1f} "
          "GB/s moved")
    print(f"{'implementation':30} {'ms':>8} {'K/V GB/s':>9} {'vs SDPA':>8}")
    print(f"{'SDPA, contiguous K/V':30} {sdpa_s * 1e3:>8.2f} {kv_bytes / sdpa_s / 1e9:>9.1f} {1.0:>7.2f}x")
    best = None
    for label, call in candidates.items():
        seconds = best_time(call, repeat)
        best = min(best or seconds, seconds)
        print(f"{label:30} {seconds * 1e3:>8.2f} {kv_bytes / seconds / 1e9:>9.1f} {seconds / sdpa_s:>7.2f}x")
    verdict = "met" if best / sdpa_s <= GOAL else "NOT met"
    print(f"best paged / SDPA = {best / sdpa_s:.2f}x (goal <= {GOAL}x: {verdict})")
    return kv_bytes / best / 1e9


def run_gbps(dtype: torch.dtype) -> float:
    """``minipaged run traces/mixed.yaml --dtype ...``'s decode-attention K/V GB/s (its CPU defaults)."""
    from minipaged_cli.apps.run import run_trace
    from minipaged_cli.cli.run import CPU_KV_MEMORY, CPU_LAYERS, CPU_MAX_STEPS
    from minipaged_cli.dataplane.backends import TorchBackend
    from minipaged_cli.sim.config import SimConfig, num_blocks_for_memory
    from minipaged_cli.units import parse_bytes
    from minipaged_cli.workloads.presets import load_gpu, load_model
    from minipaged_cli.workloads.readers import load_trace

    model = load_model("qwen3-8b")
    config = SimConfig.of(model, load_gpu("h200"), num_blocks_for_memory(parse_bytes(CPU_KV_MEMORY), model, 16))
    report = run_trace(load_trace(MIXED), config, TorchBackend("cpu"), num_layers=CPU_LAYERS, dtype=dtype,
                       max_steps=CPU_MAX_STEPS)
    return report.attention_gbps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--dtype", default="float32,bfloat16")
    parser.add_argument("--case", default="uniform,run")
    parser.add_argument("--run", action="store_true", help="also time minipaged run traces/mixed.yaml")
    parser.add_argument("--block-size", type=int, default=16)
    args = parser.parse_args()
    dtypes = [getattr(torch, name) for name in args.dtype.split(",")]
    cases = args.case.split(",")
    best_on_run: dict[torch.dtype, float] = {}
    best_on_uniform: dict[torch.dtype, float] = {}
    for dtype in dtypes:
        if "uniform" in cases:
            best_on_uniform[dtype] = measure_case("uniform", [2048] * 8, 16, 8, dtype, args.block_size, args.repeat)
        if "run" in cases or args.run:
            lengths, num_q_heads, num_kv_heads = run_shape()
            best_on_run[dtype] = measure_case("run (the busiest step of minipaged run traces/mixed.yaml)", lengths,
                                              num_q_heads, num_kv_heads, dtype, args.block_size, args.repeat)
    if args.run:
        print("\nminipaged run traces/mixed.yaml (2 layers, 4 GiB, 200 steps): decode attention's K/V GB/s")
        for dtype in dtypes:
            gbps = run_gbps(dtype)
            ratio = gbps / best_on_run[dtype]
            verdict = "met" if ratio >= 1 / GOAL else "NOT met"
            print(f"  {str(dtype).removeprefix('torch.'):9} run {gbps:5.2f} GB/s, best paged on its busiest step "
                  f"{best_on_run[dtype]:5.2f} GB/s: {ratio:.2f} (goal >= {1 / GOAL:.2f}: {verdict})")
            if dtype in best_on_uniform:
                uniform = gbps / best_on_uniform[dtype]
                print(f"  {'':9} against the uniform case's best paged {best_on_uniform[dtype]:5.2f} GB/s: "
                      f"{uniform:.2f} ({'met' if uniform >= 1 / GOAL else 'NOT met'} by that stricter reading)")


if __name__ == "__main__":
    main()
