"""``minipaged simulate TRACE``: paged vs contiguous KV allocation on one trace and one capacity.

The command's annotations are objects, not strings (no ``from __future__ import annotations``): Typer reads the
signature several times a run, and would evaluate its fifty-odd string annotations each time (15M instructions,
1.5% of a one-request simulate).
"""

from pathlib import Path
from typing import Annotated

import typer

from minipaged_cli.cli import fleet_options
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
    OptionalTraceArg,
    PlotOpt,
    PrefixCachingOpt,
    RateOpt,
    SchedulerOpt,
    SeedOpt,
    TimeScaleOpt,
    VllmVersionOpt,
    WatermarkOpt,
    flag,
    handle_errors,
    load_calibration_option,
    require_trace,
    stderr,
    stdout,
    tables_console,
)
from minipaged_cli.cli.outputs import check_outputs
from minipaged_cli.cli.render import ReplayProgress, simulation_tables, write_json
from minipaged_cli.cli.startup import collector_paused, lasting
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
from minipaged_cli.fleet.names import DEFAULT_INDEX_CAPACITY
from minipaged_cli.memory.strategies import STRATEGIES
from minipaged_cli.sim.config import DEFAULT_GPU_MEMORY_UTILIZATION, SimConfig, resolve_block_size, resolve_hybrid_kv
from minipaged_cli.sim.kv_sizing import resolve_num_blocks, tier_blocks
from minipaged_cli.sim.replay import simulate
from minipaged_cli.sim.settings import CacheSettings, EngineSettings, OutputSettings, TierSettings
from minipaged_cli.sim.vllm_releases import LATEST_VLLM
from minipaged_cli.workloads.presets import load_gpu, load_model, with_kv_cache_dtype
from minipaged_cli.workloads.readers import load_trace

EPILOG = """\
Examples:\n\n
  minipaged simulate traces/mixed.yaml\n\n
  minipaged simulate traces/azure_conv_1k.yaml --kv-memory 4GiB --cpu-kv-memory 64GiB --plot memory.png\n\n
  minipaged simulate traces/mixed.yaml --replicas 4 --router prefix-aware --json -
"""


@handle_errors
def simulate_command(
    trace_path: OptionalTraceArg = None,
    trace_format: FormatOpt = "auto",
    model: ModelOpt = "qwen3-8b",
    gpu: GpuOpt = "h200",
    vllm_version: VllmVersionOpt = LATEST_VLLM,
    block_size: BlockSizeOpt = None,
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
    replicas: fleet_options.ReplicasOpt = None,
    router: fleet_options.RouterOpt = "round-robin",
    prefix_index: fleet_options.PrefixIndexOpt = "precise",
    prefix_index_capacity: fleet_options.IndexCapacityOpt = DEFAULT_INDEX_CAPACITY,
    router_weights: fleet_options.WeightsOpt = "prefix:2,queue:1,kv:1",
    prefill_replicas: fleet_options.PrefillReplicasOpt = None,
    decode_replicas: fleet_options.DecodeReplicasOpt = None,
    kv_link_bandwidth: fleet_options.LinkBandwidthOpt = "50GB/s",
    kv_link_latency: fleet_options.LinkLatencyOpt = "20us",
    prefill_threshold: fleet_options.PrefillThresholdOpt = 0,
    shared_kv_store: fleet_options.SharedStoreOpt = False,
    fleet_file: fleet_options.FleetFileOpt = None,
    log_decisions: fleet_options.LogDecisionsOpt = False,
) -> None:
    """Replay a request trace through the paged block manager and contiguous-allocation baselines, on one KV
    capacity, and report where the memory goes: token states, reservations, internal and external
    fragmentation, free; with batch size, preemptions, throughput and latency of each strategy."""
    trace_path = require_trace(trace_path, "simulate")
    check_outputs({"--json": json_path, "--plot": plot, "--plot-layout": plot_layout})
    names = tuple(s.strip() for s in strategies.split(",") if s.strip())
    if not names:
        raise InputError("name at least one strategy", field="--strategies", value=strategies, has_value=True)
    spec = with_kv_cache_dtype(load_model(model), kv_cache_dtype)
    gpu_spec = load_gpu(gpu)
    hybrid = resolve_hybrid_kv(hybrid_kv, scheduler)
    block_size = resolve_block_size(block_size, spec, gpu_spec, scheduler, vllm_version)
    blocks, origin, sizing = resolve_num_blocks(spec, gpu_spec, block_size, num_blocks, kv_memory,
                                                gpu_memory_utilization, hybrid=hybrid, vllm_version=vllm_version,
                                                max_num_batched_tokens=max_batched_tokens,
                                                max_num_seqs=max_num_seqs)
    with lasting():  # (the trace lives as long as the process)
        trace = load_trace(trace_path, trace_format, rate=rate, seed=seed, limit=limit, time_scale=time_scale,
                           tokenizer=tokenizer)
    engine = EngineSettings(scheduler=scheduler, vllm_version=vllm_version, max_num_seqs=max_num_seqs,
                            max_batched_tokens=max_batched_tokens, watermark=watermark, preemption=preemption,
                            long_prefill_token_threshold=long_prefill_threshold)
    cache = CacheSettings(blocks, block_size, prefix_caching=prefix_caching, hybrid_kv=hybrid, cpu_blocks=cpu_blocks)
    tiers = TierSettings(
        cpu_kv_blocks=tier_blocks(cpu_kv_memory, spec, block_size, "{cpu_kv_memory}", hybrid=hybrid),
        disk_kv_blocks=tier_blocks(disk_kv_memory, spec, block_size, "{disk_kv_memory}", hybrid=hybrid),
        offload_policy=offload_policy, tier_eviction=tier_eviction, tier_inclusion=tier_inclusion,
        layerwise_loads=layerwise_loads)
    outputs = OutputSettings(check_invariants=check_invariants, record_timeline=plot is not None,
                             record_layout=plot_layout is not None)
    config = SimConfig(spec, gpu_spec, cache, engine, tiers, outputs, max_model_len=max_model_len,
                       calibration=load_calibration_option(calibration),
                       clients=clients_option(clients, concurrency, max_concurrency))

    console = tables_console(json_path)
    fleet = fleet_options.fleet_config(
        config, replicas=replicas, router=router, prefix_index=prefix_index, index_capacity=prefix_index_capacity,
        weights=router_weights, prefill_replicas=prefill_replicas, decode_replicas=decode_replicas,
        link_bandwidth=kv_link_bandwidth, link_latency=kv_link_latency, prefill_threshold=prefill_threshold,
        shared_kv_store=shared_kv_store, fleet_file=fleet_file, log_decisions=log_decisions,
        record_timeline=plot is not None)
    if fleet is not None:  # (paged only: the fleet's replicas are vLLM engines)
        with collector_paused():
            return fleet_options.run_fleet_command(trace, config, fleet, console, stdout, json_path, plot)
    with ReplayProgress(stderr, trace.num_requests, names) as progress, collector_paused():
        result = simulate(trace, config, names, progress=progress.for_replay())
    for renderable in simulation_tables(result, origin):
        console.print(renderable)
    if json_path is not None:
        document = result.to_dict()
        # what vLLM's startup log says of this pool, and how the default pool was sized (None: an exact option)
        document["config"].update(vllm_version=config.engine.vllm_version, kv_size_tokens=config.kv_size_tokens,
                                  max_concurrency=config.max_concurrency,
                                  kv_sizing=None if sizing is None else sizing.to_dict())
        write_json(document, json_path, stdout)
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
