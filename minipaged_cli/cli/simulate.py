"""``minipaged simulate TRACE``: paged vs contiguous KV allocation on one trace and one capacity."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from minipaged_cli.cli.common import (
    BlockSizeOpt,
    CalibrationOpt,
    FormatOpt,
    GpuOpt,
    GpuUtilOpt,
    HybridKvOpt,
    JsonOpt,
    KvCacheDtypeOption,
    KvMemoryOpt,
    LimitOpt,
    LongPrefillOpt,
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
    WatermarkOpt,
    flag,
    handle_errors,
    load_calibration_option,
    stderr,
    stdout,
    tables_console,
)
from minipaged_cli.cli.outputs import check_outputs
from minipaged_cli.cli.render import ReplayProgress, simulation_tables, write_json
from minipaged_cli.cli.tier_options import (
    CpuKvMemoryOpt,
    DiskKvMemoryOpt,
    LayerwiseLoadsOpt,
    OffloadPolicyOpt,
    TierEvictionOpt,
    TierInclusionOpt,
)
from minipaged_cli.cli.workload_options import (
    ClientsOpt,
    ConcurrencyOpt,
    MaxConcurrencyOpt,
    TokenizerOpt,
    clients_option,
)
from minipaged_cli.errors import InputError
from minipaged_cli.memory.strategies import STRATEGIES
from minipaged_cli.sim.config import (
    DEFAULT_BLOCK_SIZE,
    DEFAULT_GPU_MEMORY_UTILIZATION,
    SimConfig,
    resolve_hybrid_kv,
    resolve_num_blocks,
    tier_blocks,
)
from minipaged_cli.sim.replay import simulate
from minipaged_cli.workloads.presets import load_gpu, load_model, with_kv_cache_dtype
from minipaged_cli.workloads.readers import load_trace

EPILOG = """\
Examples:\n\n
  minipaged simulate traces/mixed.yaml\n\n
  minipaged simulate ../shared/traces/AzureLLMInferenceTrace_conv.csv --kv-memory 16GiB --plot memory.png\n\n
  minipaged simulate ../shared/traces/sharegpt_lengths_llama2_tokenizer.csv --rate 20 --limit 2000
  --model qwen3-8b --kv-memory 16GiB --max-model-len 8192\n\n
  minipaged simulate traces/mixed.yaml --strategies paged,oracle-reserve --json -\n\n
  minipaged simulate traces/holes.yaml --plot-layout layout.png\n\n
  minipaged simulate ../shared/traces/mooncake_conversation_trace.jsonl --strategies paged --prefix-caching
  --max-model-len 131072\n\n
  minipaged simulate ../shared/traces/mooncake_conversation_trace.jsonl --strategies paged --max-model-len 131072
  --cpu-kv-memory 256GiB --disk-kv-memory 2TiB\n\n
  minipaged simulate traces/mixed.yaml --scheduler v0 --preemption swap --cpu-blocks 20000 --watermark 0\n\n
  minipaged simulate ../shared/traces/AzureLLMInferenceTrace_conv.csv --model llama-3.1-8b --kv-cache-dtype
  fp8_e4m3\n\n
  minipaged simulate traces/mixed.yaml --model llama-2-7b --gpu h100 --calibration
  configs/calibrations/h100-llama-2-7b.yaml
"""


@handle_errors
def simulate_command(
    trace_path: TraceArg,
    trace_format: FormatOpt = "auto",
    model: ModelOpt = "qwen3-8b",
    gpu: GpuOpt = "h200",
    block_size: BlockSizeOpt = DEFAULT_BLOCK_SIZE,
    num_blocks: NumBlocksOpt = None,
    kv_memory: KvMemoryOpt = None,
    gpu_memory_utilization: GpuUtilOpt = DEFAULT_GPU_MEMORY_UTILIZATION,
    max_model_len: MaxModelLenOpt = None,
    kv_cache_dtype: KvCacheDtypeOption = "auto",
    strategies: Annotated[str, typer.Option(
        "--strategies", help="Comma-separated, from: " + ", ".join(STRATEGIES) + ".")] = ",".join(STRATEGIES),
    scheduler: SchedulerOpt = "v1",
    max_batched_tokens: MaxBatchedTokensOpt = None,
    max_num_seqs: MaxNumSeqsOpt = None,
    prefix_caching: PrefixCachingOpt = None,
    hybrid_kv: HybridKvOpt = None,
    long_prefill_threshold: LongPrefillOpt = 0,
    preemption: Annotated[str, typer.Option(
        "--preemption", help="What happens to the latest admitted request when memory runs out: recompute "
                             "(drop its KV, prefill again) or swap (to a CPU pool of --cpu-blocks; v0 only).")
    ] = "recompute",
    cpu_blocks: Annotated[int, typer.Option(
        "--cpu-blocks", help="Swap space, in blocks of --block-size tokens.")] = 0,
    watermark: WatermarkOpt = None,
    cpu_kv_memory: CpuKvMemoryOpt = None,
    disk_kv_memory: DiskKvMemoryOpt = None,
    offload_policy: OffloadPolicyOpt = "write-through",
    tier_eviction: TierEvictionOpt = "lru",
    tier_inclusion: TierInclusionOpt = "inclusive",
    layerwise_loads: LayerwiseLoadsOpt = False,
    calibration: CalibrationOpt = None,
    rate: RateOpt = None,
    seed: SeedOpt = 0,
    limit: LimitOpt = None,
    time_scale: TimeScaleOpt = 1.0,
    clients: ClientsOpt = None,
    concurrency: ConcurrencyOpt = None,
    max_concurrency: MaxConcurrencyOpt = None,
    tokenizer: TokenizerOpt = None,
    check_invariants: Annotated[bool, flag(
        "check-invariants", help="Check the allocator's invariants after every event; count violations "
                                 "(exit 1 if any).")] = False,
    json_path: JsonOpt = None,
    plot: PlotOpt = None,
    plot_layout: Annotated[Path | None, typer.Option(
        "--plot-layout", help="Draw the physical KV memory over time to this PNG: a colour per sequence, free space "
                              "blank, one panel per strategy (contiguous holes and paged scatter).", metavar="PNG",
        show_default=False)] = None,
) -> None:
    """Replay a request trace through the paged block manager and contiguous-allocation baselines, on one KV
    capacity, and report where the memory goes: token states, reservations, internal and external
    fragmentation, free; with batch size, preemptions, throughput and latency of each strategy."""
    check_outputs({"--json": json_path, "--plot": plot, "--plot-layout": plot_layout})
    names = tuple(s.strip() for s in strategies.split(",") if s.strip())
    if not names:
        raise InputError("name at least one strategy", field="--strategies", value=strategies, has_value=True)
    spec = with_kv_cache_dtype(load_model(model), kv_cache_dtype)
    gpu_spec = load_gpu(gpu)
    hybrid = resolve_hybrid_kv(hybrid_kv, scheduler)
    blocks, origin = resolve_num_blocks(spec, gpu_spec.memory_bytes, block_size, num_blocks, kv_memory,
                                        gpu_memory_utilization, hybrid=hybrid)
    trace = load_trace(trace_path, trace_format, rate=rate, seed=seed, limit=limit, time_scale=time_scale,
                       tokenizer=tokenizer)
    config = SimConfig(model=spec, gpu=gpu_spec, num_blocks=blocks, block_size=block_size,
                       max_model_len=max_model_len, max_num_seqs=max_num_seqs,
                       max_batched_tokens=max_batched_tokens, prefix_caching=prefix_caching,
                       preemption=preemption, cpu_blocks=cpu_blocks, watermark=watermark, scheduler=scheduler,
                       hybrid_kv=hybrid,
                       long_prefill_token_threshold=long_prefill_threshold,
                       calibration=load_calibration_option(calibration),
                       cpu_kv_blocks=tier_blocks(cpu_kv_memory, spec, block_size, "--cpu-kv-memory", hybrid=hybrid),
                       disk_kv_blocks=tier_blocks(disk_kv_memory, spec, block_size, "--disk-kv-memory",
                                                  hybrid=hybrid),
                       offload_policy=offload_policy, tier_eviction=tier_eviction, tier_inclusion=tier_inclusion,
                       layerwise_loads=layerwise_loads,
                       clients=clients_option(clients, concurrency, max_concurrency),
                       check_invariants=check_invariants,
                       record_timeline=plot is not None, record_layout=plot_layout is not None)

    console = tables_console(json_path)
    with ReplayProgress(stderr, trace.num_requests, names) as progress:
        result = simulate(trace, config, names, progress=progress)
    for renderable in simulation_tables(result, origin):
        console.print(renderable)
    if json_path is not None:
        write_json(result.to_dict(), json_path, stdout)
    if plot is not None:
        from minipaged_cli.cli.plot import plot_memory_timeline

        plot_memory_timeline(result, Path(plot))
        console.print(f"plot: {plot}", markup=False)
    if plot_layout is not None:
        from minipaged_cli.cli.plot import plot_memory_layout

        plot_memory_layout(result, Path(plot_layout))
        console.print(f"layout plot: {plot_layout}", markup=False)
    violations = sum(m.invariant_violations for m in result.strategies.values())
    if violations:
        stderr.print(f"invariant violations: {violations} (a bug in the allocator; see the table)")
        raise typer.Exit(1)
