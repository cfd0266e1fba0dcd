"""``minipaged sweep TRACE``: latency against request rate for every strategy, and the highest rate each sustains
under service-level objectives; in local worker processes or on a Ray cluster."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Annotated, Any

import typer
from rich import box
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from minipaged_cli.apps.sweep import SEARCH_STEPS, Axes, SweepResult, sweep
from minipaged_cli.apps.sweep_points import (
    ALL_FULL_ATTENTION,
    ENGINE_FIELDS,
    Settings,
    all_full_attention_models,
    prepare,
)
from minipaged_cli.cli import sweep_axes as axes
from minipaged_cli.cli import tier_options as tiers
from minipaged_cli.cli.common import (
    CalibrationOpt,
    FormatOpt,
    GpuUtilOpt,
    HybridKvOpt,
    JsonOpt,
    KvCacheDtypeOption,
    LimitOpt,
    MaxBatchedTokensOpt,
    MaxModelLenOpt,
    MaxNumSeqsOpt,
    NumBlocksOpt,
    PlotOpt,
    SchedulerOpt,
    SeedOpt,
    TimeScaleOpt,
    TraceArg,
    VllmVersionOpt,
    WatermarkOpt,
    handle_errors,
    refuse_options,
    stderr,
    stdout,
    tables_console,
)
from minipaged_cli.cli.outputs import atomic_output, check_outputs
from minipaged_cli.cli.render import bold, write_json
from minipaged_cli.cli.sweep_options import FILE_KEYS, checked, read_config
from minipaged_cli.cli.tier_options import OFFLOAD_POLICIES, TIER_EVICTIONS, TIER_INCLUSIONS
from minipaged_cli.cli.workload_options import SweepConcurrencyOpt, TokenizerOpt
from minipaged_cli.errors import InputError
from minipaged_cli.memory.strategies import STRATEGIES
from minipaged_cli.sim.config import DEFAULT_BLOCK_SIZE, DEFAULT_GPU_MEMORY_UTILIZATION
from minipaged_cli.sim.vllm_releases import LATEST_VLLM, vllm_release
from minipaged_cli.validation import whole_number
from minipaged_cli.workloads.readers import load_trace

EPILOG = """\
Examples:\n\n
  minipaged sweep traces/azure_conv_1k.yaml --rates 1,2,4 --kv-memory 3GiB --slo ttft-p99=1\n\n
  minipaged sweep traces/mixed.yaml --block-sizes 16,64 --prefix-caching off,on --rates 1 --csv sweep.csv\n\n
  minipaged sweep traces/mixed.yaml --config sweep.yaml --ray 10.0.0.5:6379 --json sweep.json
"""

def _engine_default(name: str) -> str:
    """Help's note on an engine setting left out: the simulator's default, read from it (one place)."""
    default = Settings().to_dict()[name]
    return "Default: the simulator's." if default is None else f"Default: {default} (the simulator's)."


@handle_errors
def sweep_command(
    ctx: typer.Context,
    trace_path: TraceArg,
    rates: Annotated[str | None, typer.Option(
        "--rates", help="Request rates (requests/s, Poisson arrivals), comma-separated: the x axis of the curves "
                        "and the starting grid of the capacity search.", show_default=False)] = None,
    strategies: Annotated[str, typer.Option("--strategies", help="Comma-separated, from: " + ", ".join(STRATEGIES)
                                            + ".")] = ",".join(STRATEGIES),
    models: Annotated[str, typer.Option("--models", "--model", help="Model presets or config.json paths.")]
    = "qwen3-8b",
    gpus: Annotated[str, typer.Option("--gpus", "--gpu", help="GPU presets or YAML files.")] = "h200",
    kv_memory: Annotated[str | None, typer.Option(
        "--kv-memory", help="KV capacities, e.g. 16GiB,default (default: --gpu-memory-utilization of each GPU "
                            "minus the weights, also when the option is left out).", show_default=False)] = None,
    block_sizes: Annotated[str, typer.Option("--block-sizes", "--block-size", help="Tokens per KV block.")]
    = str(DEFAULT_BLOCK_SIZE),
    prefix_caching: Annotated[str | None, typer.Option(
        "--prefix-caching", help="An axis: off, on, or off,on (sweep's one boolean that takes values; elsewhere "
                                 "--prefix-caching/--no-prefix-caching). Paged only. Default: the engine's, as in "
                                 "simulate: on under v1, off under v0.", show_default=False)] = None,
    slo: axes.SloOpt = None,
    search_steps: axes.SearchStepsOpt = SEARCH_STEPS,
    seeds: axes.SeedsOpt = 1,
    workers: axes.WorkersOpt = None,
    ray: axes.RayOpt = None,
    config: Annotated[Path | None, typer.Option(
        "--config", help="A YAML sweep file whose keys name these options (rates: [1, 2], slo: "
                         "{normalized-latency: 0.2}, ...).", metavar="YAML", show_default=False)] = None,
    trace_format: FormatOpt = "auto",
    seed: SeedOpt = 0,
    limit: LimitOpt = None,
    time_scale: TimeScaleOpt = 1.0,
    scheduler: Annotated[str | None, typer.Option(
        "--scheduler", help=f"{SchedulerOpt.__metadata__[0].help} {_engine_default('scheduler')}",
        show_default=False)] = None,
    max_model_len: MaxModelLenOpt = None,
    max_num_seqs: MaxNumSeqsOpt = None,
    max_batched_tokens: MaxBatchedTokensOpt = None,
    watermark: WatermarkOpt = None,
    preemption: Annotated[str | None, typer.Option(
        "--preemption", help=f"recompute or swap. {_engine_default('preemption')}", show_default=False)] = None,
    cpu_blocks: Annotated[int | None, typer.Option(
        "--cpu-blocks", help=f"Swap space, in blocks. {_engine_default('cpu_blocks')}", show_default=False)] = None,
    cpu_kv_memory: axes.CpuKvMemoryAxis = None,
    offload_policy: axes.OffloadPolicyAxis = OFFLOAD_POLICIES[0],
    tier_eviction: axes.TierEvictionAxis = TIER_EVICTIONS[0],
    tier_inclusion: axes.TierInclusionAxis = TIER_INCLUSIONS[0],
    gpu_memory_utilization: GpuUtilOpt = DEFAULT_GPU_MEMORY_UTILIZATION,
    kv_cache_dtype: KvCacheDtypeOption = "auto",
    calibration: CalibrationOpt = None,
    hybrid_kv: HybridKvOpt = None,
    vllm_version: VllmVersionOpt = LATEST_VLLM,
    replicas: axes.ReplicasAxis = "1",
    routers: axes.RoutersAxis = "round-robin",
    num_blocks: NumBlocksOpt = None,
    disk_kv_memory: tiers.DiskKvMemoryOpt = None,
    layerwise_loads: tiers.LayerwiseLoadsOpt = False,
    json_path: JsonOpt = None,
    csv_path: Annotated[Path | None, typer.Option("--csv", help="Write one row per point as CSV.", metavar="PATH",
                                                  show_default=False)] = None,
    plot: PlotOpt = None,
    concurrency: SweepConcurrencyOpt = None,
    max_concurrency: axes.MaxConcurrencyAxis = None,
    tokenizer: TokenizerOpt = None,
) -> None:
    """Replay a trace at every combination of request rates, strategies and the other axes (models, GPUs, KV
    memory, block sizes, prefix caching), and report per point the normalized latency (end-to-end latency per
    output token, mean and p99), TTFT, TPOT, batch size, throughput, preemptions and token-state share. With
    --slo, the highest request rate each strategy sustains and paged's ratio to each baseline."""
    refuse_options({"--num-blocks": num_blocks}, "sweep sizes each point's KV by --kv-memory (an axis: 16GiB,default)")
    refuse_options({"--vllm-version": None if vllm_release(vllm_version).version == LATEST_VLLM else vllm_version},
                   f"sweep's points follow vLLM {LATEST_VLLM}'s defaults; simulate --vllm-version replays another")
    refuse_options({"--disk-kv-memory": disk_kv_memory, "--layerwise-loads": layerwise_loads},
                   "sweep's points have a host tier at most, loaded whole: simulate replays the rest")
    values = {k: v for k, v in locals().items() if k in FILE_KEYS}
    from_file: set[str] = set()
    if config is not None:
        in_file = {k: v for k, v in read_config(config).items() if _source(ctx, k) != "COMMANDLINE"}
        values.update(in_file)
        from_file = set(in_file)
    check_outputs({"--json": json_path, "--csv": csv_path, "--plot": plot})  # before a sweep of hours
    if workers is not None:
        whole_number(workers, field="--workers", minimum=1)
    options = checked(values, from_file, str(config))
    if options["concurrency"] and options["rates"] is None:  # closed loops ignore arrival times: one replay each
        options["rates"] = (1.0,)
    if options["rates"] is None:
        raise InputError("give the request rates to sweep (--rates 1,2,4 or rates: in --config)", field="--rates")
    settings = Settings(seed=options["seed"], seeds=options["seeds"],
                        gpu_memory_utilization=options["gpu_memory_utilization"],
                        calibration=str(options["calibration"]) if options["calibration"] else None,
                        kv_cache_dtype=options["kv_cache_dtype"],
                        engine={k: options[k] for k in ENGINE_FIELDS if options[k] is not None})
    prefix = options["prefix_caching"] or (settings.engine_prefix_caching(),)
    axes = Axes(rates=options["rates"], strategies=options["strategies"], models=options["models"],
                gpus=options["gpus"], kv_memory=options["kv_memory"] or (None,), block_sizes=options["block_sizes"],
                prefix_caching=prefix, cpu_kv_memory=options["cpu_kv_memory"] or (None,),
                offload_policies=options["offload_policy"], tier_evictions=options["tier_eviction"],
                tier_inclusions=options["tier_inclusion"], replicas=options["replicas"], routers=options["routers"],
                concurrency=options["concurrency"] or (0,), max_concurrency=options["max_concurrency"] or (0,),
                all_full_models=all_full_attention_models(options["models"], options["strategies"], settings))
    trace = load_trace(trace_path, options["trace_format"], limit=options["limit"],
                       time_scale=options["time_scale"], tokenizer=tokenizer)
    points = axes.points()
    work = prepare(trace, settings, points)  # bad input ends here, before any progress bar
    from minipaged_cli.apps.sweep_runners import LocalRunner, RayRunner  # process pools and Ray: sweep's alone
    runner = RayRunner(ray) if ray is not None else LocalRunner(workers)
    if isinstance(runner, RayRunner) and runner.started:
        stderr.print(f"No Ray cluster was running: {runner.describe()}.", markup=False, highlight=False)

    progress = Progress(TextColumn("replays"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("left"), TimeRemainingColumn(), console=stderr, transient=True)
    with progress:
        task = progress.add_task("replays", total=len(points) * settings.seeds)
        result = sweep(trace, axes, settings, runner, options["slo"], options["search_steps"],
                       progress=lambda done, total: progress.update(task, completed=done, total=total), work=work)

    console = tables_console(json_path)
    seeds_note = f" · each the mean of {settings.seeds} arrival seeds" if settings.seeds > 1 else ""
    kv_note = f" · KV cache {settings.kv_cache_dtype}" if settings.kv_cache_dtype != "auto" else ""
    console.print(f"{bold(trace.name)}: {trace.num_requests} requests · {len(result.rows)} points on "
                  f"{escape(runner.describe())}{seeds_note}{kv_note}")
    if axes.all_full_models:
        console.print(f"{ALL_FULL_ATTENTION}: paged with every layer as full attention on the same KV memory "
                      f"(--no-hybrid-kv), beside the hybrid manager's paged ({', '.join(axes.all_full_models)})",
                      markup=False, highlight=False)
    console.print(points_table(result))
    if result.slos:
        console.print(capacity_table(result))
        for line in capacity_notes(result):
            console.print(line)
    if json_path is not None:
        write_json(result.to_dict(), json_path, stdout)
    if csv_path is not None:
        write_csv(result, csv_path)
    if plot is not None:
        from minipaged_cli.cli.plot import plot_concurrency, plot_host_tier, plot_sweep

        if any(axes.concurrency):
            plot_concurrency(result, Path(plot), title=f"{trace.name}: latency against throughput, by clients")
        elif len(axes.cpu_kv_memory) > 1:
            plot_host_tier(result, Path(plot), title=f"{trace.name}: prefix-cache hits and TTFT against host memory")
        else:
            plot_sweep(result, Path(plot), title=f"{trace.name}: normalized latency against request rate")
        console.print(f"plot: {escape(str(plot))}")


def _source(ctx: typer.Context, name: str) -> str:
    """Where an option's value came from, by name (Typer may vendor click, with its own ParameterSource)."""
    source = ctx.get_parameter_source(name)
    return source.name if source is not None else "DEFAULT"


def _label(result: SweepResult, point: Any) -> str:
    """A curve's name in the tables, escaped: model and GPU names may be paths with brackets in them."""
    parts = [_value(name, getattr(point, name)) for name in result.axes.varying()]
    return escape(" ".join([point.strategy, *parts]))


def _value(name: str, value: Any) -> str:
    if name == "kv_memory":
        return f"KV {value or 'default'}"
    if name == "prefix_caching":
        return "prefix caching" if value else "no prefix caching"
    if name == "block_size":
        return f"block {value}"
    if name == "cpu_kv_memory":
        return f"host {value or 0}"
    if name == "max_concurrency":
        return f"cap {value}" if value else "no cap"
    return str(value)


def points_table(result: SweepResult) -> Table:
    table = Table(title="Points (latencies in simulated seconds; normalized: end-to-end latency per output token)",
                  title_justify="left", box=box.SIMPLE_HEAD)
    tiers = any(point.host_bytes for point in result.rows)
    columns = ["curve", "rate/s", "norm lat mean/p99 s", "TTFT mean/p99 s", "TPOT ms", "batch", "tok/s",
               "preempt", "tok st %"] + (["hit % GPU+host"] if tiers else [])
    for column in columns:
        table.add_column(column, justify="left" if column == "curve" else "right", no_wrap=True)
    for point in sorted(result.rows, key=lambda p: p.sort_key()):
        row = result.rows[point]
        table.add_row(_label(result, point), f"{point.rate:g}",
                      _pair(row["normalized_latency_mean_s"], row["normalized_latency_p99_s"], "{:.3f}"),
                      _pair(row["ttft_mean_s"], row["ttft_p99_s"], "{:.2f}"),
                      "-" if row["tpot_mean_s"] is None else f"{row['tpot_mean_s'] * 1e3:.1f}",
                      f"{row['mean_batch_size']:.1f}", f"{row['throughput_tokens_per_s']:,.0f}",
                      _count(row["num_preemptions"]), f"{row['token_state_pct']:.1f}",
                      *([f"{row['prefix_cache_hit_pct']:.1f}+{row['tier_hit_pct']:.1f}"] if tiers else []))
    return table


def _count(value: float) -> str:
    """A count, or (--seeds) the mean of counts."""
    return f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"


def _pair(first: float | None, second: float | None, spec: str) -> str:
    return "-" if first is None or second is None else f"{spec.format(first)}/{spec.format(second)}"


def capacity_table(result: SweepResult) -> Table:
    slo = ", ".join(str(s) for s in result.slos)
    table = Table(title=f"Highest sustainable rate under {slo}", title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("curve", "requests/s", "bracket (meets, fails)", "paged / this"):
        table.add_column(column, justify="left" if column == "curve" else "right", no_wrap=True)
    ratios = {tuple(sorted((k, v) for k, v in r.items() if k != "paged_over")): r["paged_over"]
              for r in result.ratios()}
    for capacity in result.capacities or []:
        curve = capacity.curve
        panel = tuple(sorted((k, v) for k, v in vars(curve.panel).items() if k not in ("strategy", "rate")))
        ratio = ratios.get(panel, {}).get(curve.strategy, {"ratio": None})
        if capacity.status == "none":
            rate = "none meets"
        elif capacity.status == "above grid":
            rate = f">= {capacity.rate:.3g}"
        else:
            rate = f"{capacity.rate:.3g}"
        if capacity.non_monotone:
            rate += " *"
        high = "-" if capacity.bracket[1] is None else f"{capacity.bracket[1]:g}"
        table.add_row(_label(result, curve), rate, f"{capacity.bracket[0]:g}, {high}",
                      "" if curve.strategy == "paged" else _ratio(ratio))
    return table


def capacity_notes(result: SweepResult) -> list[str]:
    """What the capacity table's marks mean, when it has them (markup lines)."""
    notes = []
    capacities = result.capacities or []
    if any(c.status == "above grid" for c in capacities):
        notes.append("[dim]>= : the SLOs still held at the highest rate; add higher --rates to find the limit[/]")
    for capacity in capacities:
        if capacity.non_monotone:
            falls = "; ".join(f"fails the SLOs at {fails:g} req/s but meets them at {meets:g}"
                              for fails, meets in capacity.non_monotone)
            notes.append(f"[yellow]* {_label(result, capacity.curve)}: not monotone: {falls}. The answer is below the "
                         "first failure, and depends on the rates tested there (more --seeds smooth the noise)[/]")
    return notes


def _ratio(ratio: dict[str, Any]) -> str:
    if ratio["ratio"] is None:
        return "-"
    return f"{'' if ratio['exact'] else '>= '}{ratio['ratio']:.2f}x"


def write_csv(result: SweepResult, path: Path) -> None:
    rows = result.points()
    with atomic_output(path, "--csv") as temporary, open(temporary, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
