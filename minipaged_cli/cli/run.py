"""``minipaged run TRACE``: the paged replay with real K/V tensors: cache writes and decode attention each step."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape

from minipaged_cli.cli import tier_options as tiers
from minipaged_cli.cli.common import (
    BlockSizeOpt,
    DeviceOpt,
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
    TraceArg,
    VllmVersionOpt,
    WatermarkOpt,
    check_dtype,
    handle_errors,
    refuse_options,
    require_per_head_kv,
    require_support,
    stderr,
    stdout,
    tables_console,
)
from minipaged_cli.cli.flags import note_line
from minipaged_cli.cli.fp8_options import KvScalesOption
from minipaged_cli.cli.outputs import check_outputs
from minipaged_cli.cli.render import ReplayProgress, bold, write_json
from minipaged_cli.cli.render_dataplane import run_table
from minipaged_cli.dataplane.kv_scales import DEFAULT_SCALE_MODE, check_scale_mode
from minipaged_cli.errors import InputError
from minipaged_cli.sim.config import DEFAULT_GPU_MEMORY_UTILIZATION
from minipaged_cli.sim.vllm_releases import LATEST_VLLM
from minipaged_cli.workloads.presets import load_gpu, load_model, with_kv_cache_dtype
from minipaged_cli.workloads.readers import load_trace

EPILOG = """\
Examples:\n\n
  minipaged run traces/mixed.yaml\n\n
  minipaged run traces/azure_conv_1k.yaml --device cpu --num-layers 4 --max-steps 500 --json run.json\n\n
  minipaged run traces/mixed.yaml --device cuda --kv-cache-dtype fp8_e4m3 --plot steps.png
"""

CPU_KV_MEMORY = "4GiB"  # a pool the CPU can read every step: about 29k tokens of Qwen3-8B
CPU_MAX_STEPS = 200
CPU_LAYERS = 2


@handle_errors
def run_command(
    trace_path: TraceArg,
    trace_format: FormatOpt = "auto",
    device: DeviceOpt = "auto",
    model: ModelOpt = "qwen3-8b",
    gpu: GpuOpt = "h200",
    dtype: Annotated[str | None, typer.Option(
        "--dtype", help="float32, float16 or bfloat16. Default: the model's.", show_default=False)] = None,
    vllm_version: VllmVersionOpt = LATEST_VLLM,
    block_size: BlockSizeOpt = None,
    num_blocks: NumBlocksOpt = None,
    kv_memory: KvMemoryOpt = None,
    gpu_memory_utilization: GpuUtilOpt = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_model_len: MaxModelLenOpt = None,
    num_layers: Annotated[int | None, typer.Option(
        "--num-layers", help=f"How many of the model's layers to allocate and run. Default: all on cuda, "
                             f"{CPU_LAYERS} on cpu.", show_default=False)] = None,
    max_steps: Annotated[int | None, typer.Option(
        "--max-steps", help=f"Stop after this many steps (0: run the whole trace). Default: the whole trace on "
                            f"cuda, {CPU_MAX_STEPS} on cpu.", show_default=False)] = None,
    scheduler: SchedulerOpt = "v1",
    max_batched_tokens: MaxBatchedTokensOpt = None,
    max_num_seqs: MaxNumSeqsOpt = None,
    watermark: WatermarkOpt = None,
    prefix_caching: PrefixCachingOpt = None,
    hybrid_kv: HybridKvOpt = None,
    rate: RateOpt = None,
    seed: SeedOpt = 0,
    limit: LimitOpt = None,
    time_scale: TimeScaleOpt = 1.0,
    kv_cache_dtype: KvCacheDtypeOption = "auto",
    kv_scales: KvScalesOption = DEFAULT_SCALE_MODE,
    cpu_kv_memory: tiers.CpuKvMemoryOpt = None,
    offload_policy: tiers.OffloadPolicyOpt = "write-through",
    tier_eviction: tiers.TierEvictionOpt = "lru",
    tier_inclusion: tiers.TierInclusionOpt = "inclusive",
    disk_kv_memory: tiers.DiskKvMemoryOpt = None,
    layerwise_loads: tiers.LayerwiseLoadsOpt = False,
    json_path: JsonOpt = None,
    plot: PlotOpt = None,
) -> None:
    """Replay a trace with the paged strategy and execute every step on real tensors: the cache write of every
    new token and decode paged attention for every running sequence, in each layer (random Q/K/V from a fixed
    seed, no weights). Reports throughput, time and bandwidth of both operations, and memory use. With
    --cpu-kv-memory, the host tier's stores and loads are copies to and from host memory (pinned on a GPU).

    On the CPU the defaults keep a run short: 2 layers, a 4GiB KV capacity and 200 steps."""
    import torch  # the data plane needs torch; simulate does not

    from minipaged_cli.apps.run import run_trace
    from minipaged_cli.dataplane.select import select_backend
    from minipaged_cli.sim.config import SimConfig, resolve_block_size
    from minipaged_cli.sim.kv_sizing import resolve_num_blocks, tier_blocks
    from minipaged_cli.sim.settings import CacheSettings, EngineSettings, TierSettings

    refuse_options({"--hybrid-kv": hybrid_kv}, "run's data plane keeps one block table for every layer: a sliding-"
                   "window model runs with every layer as full attention (--no-hybrid-kv)")
    refuse_options({"--disk-kv-memory": disk_kv_memory, "--layerwise-loads": layerwise_loads},
                   "run's data plane moves blocks to a host tier only, whole, between steps: simulate models it")
    check_outputs({"--json": json_path, "--plot": plot})
    check_scale_mode(kv_scales)
    backend = select_backend(device)
    on_cpu = backend.device.type == "cpu"
    spec = with_kv_cache_dtype(load_model(model), kv_cache_dtype)
    require_per_head_kv(spec, "simulate and sweep model its KV cache")
    require_support(backend, spec.num_q_heads, spec.num_kv_heads, spec.head_dim, spec.name, kv_cache_dtype)
    gpu_spec = load_gpu(gpu)
    if on_cpu and kv_memory is None and num_blocks is None:
        kv_memory = CPU_KV_MEMORY
    # the data plane keeps one block table for every layer: a sliding-window model runs as all full attention
    block_size = resolve_block_size(block_size, spec, gpu_spec, scheduler, vllm_version)
    blocks, origin, _ = resolve_num_blocks(spec, gpu_spec, block_size, num_blocks, kv_memory,
                                           gpu_memory_utilization, hybrid=False, vllm_version=vllm_version,
                                           max_num_batched_tokens=max_batched_tokens, max_num_seqs=max_num_seqs)
    if num_layers is None:
        num_layers = CPU_LAYERS if on_cpu else spec.num_layers
    if not 1 <= num_layers <= spec.num_layers:
        raise InputError(f"must be in [1, {spec.num_layers}] for {spec.name}", field="--num-layers", value=num_layers,
                         has_value=True)
    if max_steps is None:
        max_steps = CPU_MAX_STEPS if on_cpu else 0
    if max_steps < 0:
        raise InputError("must be >= 0", field="--max-steps", value=max_steps, has_value=True)
    dtype_name = dtype or spec.dtype
    check_dtype(dtype_name)
    trace = load_trace(trace_path, trace_format, rate=rate, seed=seed, limit=limit, time_scale=time_scale)
    engine = EngineSettings(scheduler=scheduler, vllm_version=vllm_version, max_num_seqs=max_num_seqs,
                            max_batched_tokens=max_batched_tokens, watermark=watermark)
    cpu_kv_blocks = tier_blocks(cpu_kv_memory, spec, block_size, "{cpu_kv_memory}", hybrid=False)
    tier_settings = TierSettings(cpu_kv_blocks=cpu_kv_blocks, offload_policy=offload_policy,
                                 tier_eviction=tier_eviction, tier_inclusion=tier_inclusion)
    cache = CacheSettings(blocks, block_size, prefix_caching=prefix_caching, hybrid_kv=False)
    config = SimConfig(spec, gpu_spec, cache, engine, tier_settings, max_model_len=max_model_len)

    console = tables_console(json_path)
    with ReplayProgress(stderr, trace.num_requests, ("paged",)) as progress:
        shown = progress.for_replay()
        report = run_trace(trace, config, backend, num_layers=num_layers, dtype=getattr(torch, dtype_name),
                           max_steps=max_steps or None, seed=seed,
                           progress=None if shown is None else lambda done: shown("paged", done), scale_mode=kv_scales)
    stored = dtype_name if kv_cache_dtype == "auto" else f"{dtype_name} (KV cache {kv_cache_dtype})"
    header = (f"{bold(trace.name)}: {escape(spec.name)}, {num_layers} of {spec.num_layers} layers, {stored}, "
              f"{config.kv_capacity_tokens:,} token slots ({escape(note_line(origin))}), block size {block_size} · "
              f"{report.steps:,} steps" + (f" (stopped at --max-steps {max_steps})" if max_steps and
                                           report.steps >= max_steps else ""))
    console.print(header)
    console.print(run_table(report))
    if json_path is not None:
        write_json(report.to_dict(), json_path, stdout)
    if plot is not None:
        from minipaged_cli.cli.plot import plot_run_steps

        plot_run_steps(report, Path(plot), title=f"{trace.name} on {report.device} ({report.backend})")
        console.print(f"plot: {plot}", markup=False)
