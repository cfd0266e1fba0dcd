"""``minipaged profile``: the block-size trade-off on one trace, measured."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich import box
from rich.markup import escape
from rich.table import Table

from minipaged_cli.cli import tier_options as tiers
from minipaged_cli.cli.common import (
    FormatOpt,
    GpuOpt,
    GpuUtilOpt,
    HybridKvOpt,
    JsonOpt,
    KvCacheDtypeOption,
    KvMemoryOpt,
    LimitOpt,
    MaxBatchedTokensOpt,
    MaxModelLenOpt,
    MaxNumSeqsOpt,
    ModelOpt,
    NumBlocksOpt,
    PlotOpt,
    PrefixCachingOpt,
    RateOpt,
    SchedulerOpt,
    SeedOpt,
    TimeScaleOpt,
    VllmVersionOpt,
    WatermarkOpt,
    check_dtype,
    flag,
    handle_errors,
    refuse_options,
    require_per_head_kv,
    require_support,
    stderr,
    stdout,
    tables_console,
)
from minipaged_cli.cli.flags import note_line
from minipaged_cli.cli.outputs import check_outputs
from minipaged_cli.cli.render import ReplayProgress, bold, kv_format, write_json
from minipaged_cli.cli.render_dataplane import profile_detail, profile_table
from minipaged_cli.cli.startup import lasting
from minipaged_cli.cli.sweep_options import CHECKS
from minipaged_cli.errors import InputError
from minipaged_cli.sim.config import DEFAULT_GPU_MEMORY_UTILIZATION
from minipaged_cli.sim.vllm_releases import LATEST_VLLM
from minipaged_cli.workloads.presets import load_gpu, load_model, with_kv_cache_dtype
from minipaged_cli.workloads.readers import load_trace

if TYPE_CHECKING:
    from minipaged_cli.apps.profile import OffloadCost

EPILOG = """\
Examples:\n\n
  minipaged profile\n\n
  minipaged profile traces/azure_conv_1k.yaml --block-sizes 16,64,256 --device none\n\n
  minipaged profile traces/mixed.yaml --block-size 16 --offload --json profile.json --plot profile.png
"""
# Live tokens of the timed attention batch, at most: the CPU reference and, far slower, the emulated kernels.
KERNEL_TOKEN_CAP = {"torch": 65_536, "emulated": 2_048}
# Bytes each timed offload call moves (at least one block): on a GPU, enough to reach the link's bandwidth.
OFFLOAD_BYTES = {"cuda": 256 * 2**20, "torch": 32 * 2**20, "emulated": 2**20}


@handle_errors
def profile_command(
    trace_path: Annotated[Path, typer.Argument(help="Request trace (default: traces/mixed.yaml).",
                                               metavar="[TRACE]")] = Path("traces/mixed.yaml"),
    block_sizes: Annotated[list[str] | None, typer.Option(
        "--block-sizes", "--block-size", help="Block sizes to profile, comma-separated (--block-size 16: one). "
                                              "Default: 1,8,16,32,64,128.", show_default=False)] = None,
    trace_format: FormatOpt = "auto",
    model: ModelOpt = "qwen3-8b",
    gpu: GpuOpt = "h200",
    num_blocks: NumBlocksOpt = None,
    kv_memory: KvMemoryOpt = None,
    gpu_memory_utilization: GpuUtilOpt = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_model_len: MaxModelLenOpt = None,
    kv_cache_dtype: KvCacheDtypeOption = "auto",
    scheduler: SchedulerOpt = "v1",
    vllm_version: VllmVersionOpt = LATEST_VLLM,
    max_batched_tokens: MaxBatchedTokensOpt = None,
    max_num_seqs: MaxNumSeqsOpt = None,
    watermark: WatermarkOpt = None,
    prefix_caching: PrefixCachingOpt = None,
    hybrid_kv: HybridKvOpt = None,
    cpu_kv_memory: tiers.CpuKvMemoryOpt = None,
    disk_kv_memory: tiers.DiskKvMemoryOpt = None,
    offload_policy: tiers.OffloadPolicyOpt = None,  # type: ignore[assignment]  (refused: see refuse_options below)
    tier_eviction: tiers.TierEvictionOpt = None,  # type: ignore[assignment]
    tier_inclusion: tiers.TierInclusionOpt = None,  # type: ignore[assignment]
    layerwise_loads: tiers.LayerwiseLoadsOpt = False,
    device: Annotated[str, typer.Option(
        "--device", help="Where kernels are timed: auto (the CUDA kernels when a GPU and PyCUDA are there, else "
                         "cpu; none for a model with multi-head latent attention, which no kernel runs), cpu, "
                         "cuda, emulated, or none (no timings).")
    ] = "auto",
    dtype: Annotated[str | None, typer.Option("--dtype", help="KV dtype for the kernel timings. Default: the "
                                                              "model's.", show_default=False)] = None,
    repeat: Annotated[int, typer.Option("--repeat", help="Timed repetitions per kernel (the median counts).")] = 5,
    offload: Annotated[bool, flag(
        "offload", help="Also time KV offloading per block size: whole blocks of every layer stored to host "
                        "memory and loaded back, in both host layouts (per-layer blocks; contiguous across layers).")
    ] = False,
    rate: RateOpt = None,
    seed: SeedOpt = 0,
    limit: LimitOpt = None,
    time_scale: TimeScaleOpt = 1.0,
    json_path: JsonOpt = None,
    plot: PlotOpt = None,
) -> None:
    """Which block size? For each, on the same trace and the same KV memory: the waste at the tail of every
    sequence, the block-table metadata and allocations, what capacity buys (token states, batch size,
    preemptions, throughput), prefix reuse lost to partial blocks, and the cost of cache writes and decode
    attention on a batch shaped like the trace's busiest step. Ends with a recommendation and its reason.
    With a single --block-size, also the distribution of tail waste and where the memory goes."""
    from minipaged_cli.apps.profile import (
        DEFAULT_BLOCK_SIZES,
        profile_block_size,
        recommend,
        time_kernels,
        time_offload,
    )
    from minipaged_cli.memory.kv_groups import block_bytes, kv_cache_groups
    from minipaged_cli.sim.config import SimConfig, resolve_hybrid_kv
    from minipaged_cli.sim.kv_sizing import resolve_num_blocks
    from minipaged_cli.sim.replay import check_capacity
    from minipaged_cli.sim.settings import CacheSettings, EngineSettings

    refuse_options({"--cpu-kv-memory": cpu_kv_memory, "--disk-kv-memory": disk_kv_memory,
                    "--offload-policy": offload_policy, "--tier-eviction": tier_eviction,
                    "--tier-inclusion": tier_inclusion, "--layerwise-loads": layerwise_loads},
                   "profile compares block sizes on the GPU's memory alone; simulate --block-size replays one "
                   "with tiers")
    check_outputs({"--json": json_path, "--plot": plot})

    sizes = CHECKS["block_sizes"](",".join(block_sizes), {"field": "--block-sizes"}) if block_sizes \
        else DEFAULT_BLOCK_SIZES
    if repeat < 1:
        raise InputError("must be >= 1", field="--repeat", value=repeat, has_value=True)
    spec, gpu_spec = with_kv_cache_dtype(load_model(model), kv_cache_dtype), load_gpu(gpu)
    hybrid = resolve_hybrid_kv(hybrid_kv, scheduler)
    blocks, origin, _ = resolve_num_blocks(spec, gpu_spec, sizes[0], num_blocks, kv_memory,
                                           gpu_memory_utilization, hybrid=hybrid, vllm_version=vllm_version,
                                           max_num_batched_tokens=max_batched_tokens, max_num_seqs=max_num_seqs)
    # every block size gets these bytes (a block of a sliding-window model: one KV cache group's pages)
    kv_bytes = blocks * block_bytes(spec, kv_cache_groups(spec, hybrid=hybrid), sizes[0])
    if spec.is_mla:  # (no kernel of the data plane runs latent attention or moves its cache: nothing to time)
        if offload or device not in ("auto", "none"):
            require_per_head_kv(spec, "--device none without --offload profiles its block sizes without timings")
        device = "none"
    backend = None
    if device != "none":  # the kernel timings need torch (the [torch] extra); the replays do not
        from minipaged_cli.dataplane.select import select_backend

        backend = select_backend(device)
        require_support(backend, spec.num_q_heads, spec.num_kv_heads, spec.head_dim, spec.name)
    dtype_name = dtype or spec.dtype
    check_dtype(dtype_name)
    with lasting():  # (the trace lives as long as the process)
        trace = load_trace(trace_path, trace_format, rate=rate, seed=seed, limit=limit, time_scale=time_scale)
    engine = EngineSettings(scheduler=scheduler, vllm_version=vllm_version, max_num_seqs=max_num_seqs,
                            max_batched_tokens=max_batched_tokens, watermark=watermark)
    cache = CacheSettings(blocks, sizes[0], prefix_caching=prefix_caching, hybrid_kv=hybrid_kv)
    base = SimConfig(spec, gpu_spec, cache, engine, max_model_len=max_model_len)
    check_capacity(trace, base, ("paged",))

    rows = []
    with ReplayProgress(stderr, trace.num_requests, tuple(f"block size {b}" for b in sizes)) as progress:
        shown = progress.for_replay()
        for size in sizes:
            rows.append(profile_block_size(
                trace, base, size, kv_bytes,
                progress=None if shown is None else lambda done, size=size: shown(f"block size {size}", done)))
    if backend is not None:
        import torch

        # One batch for every size: the busiest step of the first replay.
        shape = rows[0].metrics.detail.busiest_seq_lens  # type: ignore[union-attr]
        cap = KERNEL_TOKEN_CAP.get(backend.name) if backend.device.type == "cpu" else None
        with stderr.status("timing the kernels"):
            for row in rows:
                if shape:
                    row.kernel = time_kernels(backend, base, row.block_size, shape, getattr(torch, dtype_name),
                                              cap, repeat, seed)
    offload_costs = []
    if offload and backend is not None:
        import torch

        with stderr.status("timing KV offloading"):
            for row in rows:
                offload_costs += time_offload(backend, spec, row.block_size, getattr(torch, dtype_name),
                                              spec.num_layers, OFFLOAD_BYTES[backend.name], repeat, seed)
    elif offload:
        raise InputError("timing KV offloading needs a device", field="--device", value=device, has_value=True)
    choice, reason = recommend(rows)

    console = tables_console(json_path)
    device_name = str(backend.device) if backend is not None else "none"
    backend_name = backend.name if backend is not None else "none"
    console.print(f"{bold(trace.name)}: {trace.num_requests} requests · {escape(spec.name)} · {kv_format(spec)}, "
                  f"{kv_bytes / 2**30:.3g} GiB at every block size ({escape(note_line(origin))}) · kernels on "
                  f"{device_name} ({backend_name})")
    console.print(profile_table(rows))
    if backend is not None and backend.name == "emulated":
        console.print("[dim]kernel times are the CPU emulation's: they show the kernels run, not how fast a GPU "
                      "runs them[/]")
    if offload_costs:
        console.print(offload_table(offload_costs, device_name, spec.num_layers))
    if len(rows) == 1:
        for renderable in profile_detail(rows[0]):
            console.print(renderable)
    console.print(f"[bold]recommendation: block size {choice}[/] - {reason}")
    if json_path is not None:
        write_json({"trace": trace.name, "device": device_name, "backend": backend_name,
                    "kv_cache_dtype": spec.kv_cache_dtype, "kv_bytes_per_token": spec.kv_bytes_per_token,
                    "rows": [r.to_dict() for r in rows], "offload": [c.to_dict() for c in offload_costs],
                    "recommendation": {"block_size": choice, "reason": reason}}, json_path, stdout)
    if plot is not None:
        from minipaged_cli.cli.plot import plot_block_sizes

        plot_block_sizes(rows, Path(plot), title=f"{trace.name}: block-size trade-off ({spec.name})")
        console.print(f"plot: {plot}", markup=False)


def offload_table(costs: list[OffloadCost], device: str, num_layers: int) -> Table:
    """A row per (block size, host layout): copies per block, bytes per copy, store and load GB/s."""
    on = "this CPU: memory copies, not a PCIe link" if device == "cpu" else device
    table = Table(title=f"KV offloading per block size, {num_layers} layers, on {on} (store: device -> host, "
                        "gather included; load: host -> device, scatter included; median GB/s)",
                  title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("block", "host layout", "blocks", "copies/block", "KiB/copy", "store GB/s", "load GB/s"):
        table.add_column(column, justify="left" if column == "host layout" else "right")
    for cost in costs:
        table.add_row(str(cost.block_size), cost.layout, str(cost.num_blocks), str(cost.copies_per_block),
                      f"{cost.copy_bytes / 1024:,.0f}", f"{cost.store_gbps:.2f}", f"{cost.load_gbps:.2f}")
    return table
