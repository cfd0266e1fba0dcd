"""The CUDA kernels on a GPU: decode attention bandwidth and latency, cache-write bandwidth, each beside baselines
measured in the same run. Needs a GPU and PyCUDA (``pip install -e ".[gpu]"``, or the carried wheels of
``benchmarks/gpu_session.sh``).

Decode attention, Qwen3-8B heads (32 q / 8 kv, head_dim 128), bf16, block 16, blocks permuted at random in a K/V
pool of several GB: B=32 x 4,096 tokens, B=1 x 1,024 (latency), B=64 x 512, and a skewed batch. Beside each: a
device-to-device copy of the same K/V bytes (the practical ceiling) and, where the lengths are equal, torch SDPA on
the same K/V stored contiguously (enable_gqa). Cache write: GB/s at 16,384 tokens and microseconds at 64. KV
offloading: store and load GB/s per block size in both host layouts, against one pinned copy of the same bytes.

How kernel time is measured, not Python's: the GPU is first given a delay (``torch.cuda._sleep``), and while it
waits the host queues ``--launches`` calls back to back between two CUDA events; the events then time the kernels
alone, divided by the number of calls. Each call reads a different block table (or a different copy of the
baseline's data), rotating over enough of them that the calls together read more than the L2 cache holds, so no
call finds its K/V in L2. The calls are the launchers without their argument checks (``launch_attention``,
``_cache_write``): a check reads device tensors back, which would wait for the delay. Launch overhead (host seconds
to queue one call, the split plan included) is reported on its own line per case; if queuing outlasts the delay,
the line says so (the figure then includes host gaps). The median of ``--repeat`` such timings counts.

Then the same over an fp8 e4m3 cache (scales 1, issue 23): B=32 x 4,096 and B=1 x 1,024 with both kernels, and
the cache write that quantizes. An fp8 cache reads half the bytes, so at the same TB/s the kernel takes half the
time: the line to compare is the kernel's microseconds against its bf16 line above.

Goals (issue 14): attention >= 4.0 TB/s at B=32 x 4,096 on an H200 (about 93 % of the copy) and at least as fast
as contiguous SDPA; <= 10 us at B=1 x 1,024; cache write >= 70 % of the copy ceiling at 16,384 tokens.

    python benchmarks/kernels_gpu.py [--repeat 7] [--launches 20] [--pool-gib 8]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from minipaged_cli.dataplane.cuda import CudaBackend, cuda_backend_unavailable_reason
from minipaged_cli.dataplane.emulation import EmulatedBackend
from minipaged_cli.dataplane.kernel_backend import KernelBackend
from minipaged_cli.dataplane.kernels import random_block_tables

NUM_Q_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE, DTYPE = 32, 8, 128, 16, torch.bfloat16
CASES = {  # name: (sequence lengths, query heads)
    "B=32 x 4096": ([4096] * 32, NUM_Q_HEADS),
    "B=32 x 4096, 64 q heads (g 8)": ([4096] * 32, 64),
    "B=1 x 1024": ([1024], NUM_Q_HEADS),
    "B=64 x 512": ([512] * 64, NUM_Q_HEADS),
    "skewed (32 seqs, 131,072 tokens)": ([32768, 16384, 8192, 8192, 4096, 4096] + [2048] * 26 + [2048 - 6],
                                         NUM_Q_HEADS),
}
VARIANTS = ("tensor-core", "simple")  # the launcher's bf16 choice first, the simple kernel as the same-run baseline
FP8_CASES = ("B=32 x 4096", "B=1 x 1024")  # the fp8 section's: the bandwidth case and the latency case
FP8 = torch.float8_e4m3fn
L2_DEFEAT_BYTES = 256 * 2**20  # the calls of one timing together read at least this much (> any GPU's L2)
SLEEP_CYCLES = 100_000_000  # ~50 ms at 2 GHz: longer than queuing any case's calls takes


class Clock:
    """How the cases are timed: queued behind a GPU-side delay, or, for ``--dry-run``, not at all (every call runs
    once, and the figures printed are placeholders)."""

    def __init__(self, launches: int, repeat: int, dry_run: bool = False) -> None:
        self.launches = launches
        self.repeat = repeat
        self.dry_run = dry_run

    def rotations(self, bytes_per_call: int, limit: int = 64) -> int:
        """How many distinct inputs to rotate over so that one timing's calls read more than the L2 holds."""
        return max(1, min(2 if self.dry_run else limit, -(-L2_DEFEAT_BYTES // max(bytes_per_call, 1))))

    def time(self, calls: list[Callable[[], object]]) -> tuple[float, float, bool]:
        """(median device seconds per call, host seconds to queue one call, whether the queue ever ran dry).

        ``calls`` rotate: call i of a timing is ``calls[i % len(calls)]``. Every timing queues ``launches`` calls
        behind a GPU-side delay, between two events."""
        for call in calls:  # warm-up: compile, plan, allocate
            call()
        if self.dry_run:
            return 1.0, 0.0, False
        torch.cuda.synchronize()
        device_times, host_times, dry = [], [], False
        for _ in range(self.repeat):
            before, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
            before.record()
            torch.cuda._sleep(SLEEP_CYCLES)
            start.record()
            queued = time.perf_counter()
            for i in range(self.launches):
                calls[i % len(calls)]()
            host = time.perf_counter() - queued
            end.record()
            end.synchronize()
            dry |= host > before.elapsed_time(start) / 1e3  # the GPU caught up with the host: gaps in the timing
            device_times.append(start.elapsed_time(end) / 1e3 / self.launches)
            host_times.append(host / self.launches)
        return statistics.median(device_times), statistics.median(host_times), dry


def copy_calls(num_bytes: int, device: torch.device, clock: Clock) -> list[Callable[[], object]]:
    """Device-to-device copies of ``num_bytes``, rotating over sources so that L2 holds none of them."""
    count = clock.rotations(2 * num_bytes)
    elements = num_bytes // torch.tensor([], dtype=DTYPE).element_size()
    sources = [torch.empty(elements, device=device, dtype=DTYPE) for _ in range(count)]
    target = torch.empty(elements, device=device, dtype=DTYPE)
    return [lambda source=source: target.copy_(source) for source in sources]


def attention_case(name: str, lengths: list[int], num_q_heads: int, backend: KernelBackend,
                   key_cache: torch.Tensor, value_cache: torch.Tensor, generator: torch.Generator, clock: Clock,
                   variant: str, scales: tuple[torch.Tensor, torch.Tensor] | tuple[None, None] = (None, None)) -> None:
    """One decode-attention case; ``scales`` (k_scale, v_scale) with fp8 caches."""
    device, element = backend.device, key_cache.element_size()
    num_blocks, batch, scale = key_cache.shape[0], len(lengths), HEAD_DIM ** -0.5
    kv_bytes = 2 * sum(lengths) * NUM_KV_HEADS * HEAD_DIM * element
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=device)
    query = torch.randn(batch, num_q_heads, HEAD_DIM, device=device, dtype=DTYPE)  # bf16 over any cache
    tables = [random_block_tables(lengths, num_blocks, BLOCK_SIZE, generator).to(device)
              for _ in range(clock.rotations(kv_bytes))]
    max_len, total = max(lengths), sum(lengths)
    backend.attention_variant = variant
    kernel_s, launch_s, dry = clock.time(
        [lambda table=table: backend.launch_attention(query, key_cache, value_cache, table, seq_lens, scale, max_len,
                                                      total, *scales)
         for table in tables])
    name = f"{name}, {variant}"
    moved = kv_bytes + 2 * query.numel() * query.element_size() + tables[0].numel() * 4
    copy_s = clock.time(copy_calls(kv_bytes, device, clock))[0]
    copy_tbps = 2 * kv_bytes / copy_s / 1e12  # a copy reads and writes the bytes
    sdpa_text = "-"
    if len(set(lengths)) == 1 and scales[0] is None:  # SDPA takes equal lengths without padding (and no fp8)
        pairs = [(torch.randn(batch, NUM_KV_HEADS, max_len, HEAD_DIM, device=device, dtype=DTYPE),
                  torch.randn(batch, NUM_KV_HEADS, max_len, HEAD_DIM, device=device, dtype=DTYPE))
                 for _ in range(min(clock.rotations(kv_bytes), 8))]
        q4 = query[:, :, None, :]
        sdpa_s = clock.time([lambda k=k, v=v: F.scaled_dot_product_attention(q4, k, v, scale=scale, enable_gqa=True)
                             for k, v in pairs])[0]
        sdpa_text = f"{sdpa_s * 1e6:.1f} us ({sdpa_s / kernel_s:.2f}x)"
    tbps = moved / kernel_s / 1e12
    print(f"{name:50} {kernel_s * 1e6:>10.1f} {tbps:>7.2f} {copy_tbps:>10.2f} {tbps / copy_tbps:>8.0%}   {sdpa_text}")
    print(f"{'':50} launch overhead {launch_s * 1e6:.1f} us of host time a call"
          + (" (the queue ran dry: host gaps are in the timing)" if dry else ""))


def cache_write_case(tokens: int, backend: KernelBackend, key_cache: torch.Tensor, value_cache: torch.Tensor,
                     generator: torch.Generator, clock: Clock,
                     scales: tuple[torch.Tensor, torch.Tensor] | tuple[None, None] = (None, None)) -> None:
    """Bytes moved: bf16 read, the cache's element written."""
    device = backend.device
    qkv = torch.randn(tokens, NUM_Q_HEADS + 2 * NUM_KV_HEADS, HEAD_DIM, device=device, dtype=DTYPE)
    key, value = qkv[:, NUM_Q_HEADS:NUM_Q_HEADS + NUM_KV_HEADS], qkv[:, NUM_Q_HEADS + NUM_KV_HEADS:]
    num_slots = key_cache.shape[0] * BLOCK_SIZE
    elements = 2 * tokens * NUM_KV_HEADS * HEAD_DIM
    written = elements * (key.element_size() + key_cache.element_size()) // 2  # (read + write) / 2
    mappings = [torch.randperm(num_slots, generator=generator)[:tokens].to(torch.int64).to(device)
                for _ in range(clock.rotations(written))]
    write_s, launch_s, dry = clock.time(
        [lambda slots=slots: backend._cache_write(key, value, key_cache, value_cache, slots, *scales)
         for slots in mappings],
    )
    copy_s = clock.time(copy_calls(written, device, clock))[0]
    print(f"{tokens:>6} tokens: {write_s * 1e6:8.1f} us, {2 * written / write_s / 1e9:8.1f} GB/s moved (read + "
          f"write); a copy of the same bytes {2 * written / copy_s / 1e9:8.1f} GB/s: {copy_s / write_s:.0%} of it; "
          f"launch overhead {launch_s * 1e6:.1f} us" + (" (queue ran dry)" if dry else ""))


def offload_case(backend: KernelBackend, clock: Clock, transfer_bytes: int) -> None:
    """KV offloading (dataplane/offload.py) of Qwen3-8B's 36 layers per block size, both host layouts, against
    one pinned copy of the same bytes each way (the link's ceiling, same run). Host-clock timing around each store
    or load and its synchronisation (the per-copy launch cost is what the layouts trade), not the delayed queue."""
    from minipaged_cli.apps.host_link import measure_host_link
    from minipaged_cli.apps.profile import time_offload
    from minipaged_cli.workloads.presets import load_model

    model = load_model("qwen3-8b")
    repeat = 1 if clock.dry_run else 3  # each call moves 128 MiB: three fit the bench step's budget
    num_layers, block_sizes = (2, (8,)) if clock.dry_run else (model.num_layers, (8, 16, 32, 64, 128))
    link = measure_host_link(backend.device, (transfer_bytes,), repeat)
    ceiling = {d: link.gbps(d, link.is_pcie)[0] for d in ("device_to_host", "host_to_device")}
    print(f"\nKV offloading, {model.name} ({num_layers} layers, bf16), {transfer_bytes / 2**20:.0f} MiB a call; "
          f"one {'pinned' if link.is_pcie else 'host'} copy of the same bytes: D2H {ceiling['device_to_host']:.1f} "
          f"GB/s, H2D {ceiling['host_to_device']:.1f} GB/s")
    print(f"{'block':>6} {'host layout':12} {'copies/block':>12} {'KiB/copy':>9} {'store GB/s':>11} {'load GB/s':>10}"
          f" {'store/copy':>10} {'load/copy':>9}")
    for block_size in block_sizes:
        for cost in time_offload(backend, model, block_size, DTYPE, num_layers, transfer_bytes, repeat):
            print(f"{block_size:>6} {cost.layout:12} {cost.copies_per_block:>12} {cost.copy_bytes / 1024:>9,.0f} "
                  f"{cost.store_gbps:>11.1f} {cost.load_gbps:>10.1f} "
                  f"{cost.store_gbps / ceiling['device_to_host']:>10.0%} "
                  f"{cost.load_gbps / ceiling['host_to_device']:>9.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="timings per case; the median counts")
    parser.add_argument("--launches", type=int, default=20, help="calls queued between the two events")
    parser.add_argument("--pool-gib", type=float, default=8.0, help="K/V pool the block tables point into")
    parser.add_argument("--dry-run", action="store_true",
                        help="run every case's code on tiny shapes through the emulated kernels on the CPU, untimed: "
                             "catches a mistake here before a GPU window would")
    args = parser.parse_args()
    clock = Clock(args.launches, args.repeat, args.dry_run)
    cases, cache_write_tokens = CASES, (16384, 64)
    backend: KernelBackend
    if args.dry_run:
        backend = EmulatedBackend()
        # The emulated kernels run a thread at a time: a case's first and last sequences, 256 times shorter, keep
        # its shape (one or several sequences, equal or skewed lengths) at a cost CI can pay.
        cases = {name: ([max(1, n // 256) for n in lengths[:1] + lengths[1:][-1:]], heads)
                 for name, (lengths, heads) in CASES.items()}
        cache_write_tokens = (64, 4)
        print("dry run: the emulated kernels on the CPU, tiny shapes, no timing (every figure is a placeholder)")
    else:
        reason = cuda_backend_unavailable_reason()
        if reason is not None:
            raise SystemExit(f"kernels_gpu.py needs the CUDA backend: {reason}")
        backend = CudaBackend()
        properties = torch.cuda.get_device_properties(backend.device)
        print(f"{properties.name}, {properties.multi_processor_count} SMs, {properties.total_memory / 2**30:.0f} "
              f"GiB; torch {torch.__version__}, CUDA {torch.version.cuda}; {args.launches} calls a timing, median "
              f"of {args.repeat}")
    device = backend.device
    block_bytes = NUM_KV_HEADS * BLOCK_SIZE * HEAD_DIM * torch.tensor([], dtype=DTYPE).element_size()
    pool_gib = 2 ** -7 if args.dry_run else args.pool_gib
    num_blocks = int(pool_gib * 2**30 / (2 * block_bytes))
    key_cache = torch.randn(num_blocks, NUM_KV_HEADS, BLOCK_SIZE, HEAD_DIM, device=device, dtype=DTYPE)
    value_cache = torch.randn_like(key_cache)
    generator = torch.Generator(device="cpu").manual_seed(0)

    print(f"\ndecode attention ({NUM_Q_HEADS} q / {NUM_KV_HEADS} kv heads, head_dim {HEAD_DIM}, bf16, block "
          f"{BLOCK_SIZE}, pool {num_blocks * 2 * block_bytes / 2**30:.1f} GiB); TB/s: K/V + Q + O + tables read "
          "or written per second; copy: the same K/V bytes copied, same run")
    print(f"{'case':50} {'kernel us':>10} {'TB/s':>7} {'copy TB/s':>10} {'vs copy':>8}   contiguous SDPA")
    for name, (lengths, num_q_heads) in cases.items():
        for variant in VARIANTS:
            attention_case(name, lengths, num_q_heads, backend, key_cache, value_cache, generator, clock, variant)
    print("\ncache write (bf16, 8 kv heads, head_dim 128, slots permuted)")
    for tokens in cache_write_tokens:
        cache_write_case(tokens, backend, key_cache, value_cache, generator, clock)

    # The same pool's values in fp8 e4m3 (randn fits its range with scale 1): half the bytes a token.
    scales = (torch.ones(NUM_KV_HEADS, device=device), torch.ones(NUM_KV_HEADS, device=device))
    key_cache, value_cache = key_cache.to(FP8), value_cache.to(FP8)
    print("\nfp8 e4m3 KV cache, same pool, bf16 queries (TB/s of the bytes moved: 1 a K/V element)")
    for name in FP8_CASES:
        lengths, num_q_heads = cases[name]
        for variant in VARIANTS:
            attention_case(f"{name}, e4m3", lengths, num_q_heads, backend, key_cache, value_cache, generator, clock,
                           variant, scales)
    print("\ncache write into fp8 e4m3 (bf16 in, quantized by the scales)")
    for tokens in cache_write_tokens:
        cache_write_case(tokens, backend, key_cache, value_cache, generator, clock, scales)
    del key_cache, value_cache  # the offload case sizes its own cache
    offload_case(backend, clock, 2**16 if args.dry_run else 128 * 2**20)


if __name__ == "__main__":
    main()
