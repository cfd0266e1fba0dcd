"""``minipaged sweep TRACE``: latency against request rate for every strategy, and the highest rate each sustains
under service-level objectives; in local worker processes or on a Ray cluster."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml
from rich import box
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from minipaged_cli.apps.sweep import SLO_METRICS, Axes, SweepResult, parse_slo, sweep
from minipaged_cli.apps.sweep_points import Settings, prepare
from minipaged_cli.apps.sweep_runners import LocalRunner, RayRunner
from minipaged_cli.cli.common import (
    CalibrationOpt,
    FormatOpt,
    GpuUtilOpt,
    JsonOpt,
    LimitOpt,
    MaxModelLenOpt,
    PlotOpt,
    SeedOpt,
    TimeScaleOpt,
    TraceArg,
    WatermarkOpt,
    handle_errors,
    stderr,
    stdout,
    tables_console,
)
from minipaged_cli.cli.render import write_json
from minipaged_cli.errors import InputError
from minipaged_cli.memory.strategies import STRATEGIES
from minipaged_cli.workloads.readers import load_trace

EPILOG = """\
Examples:\n\n
  minipaged sweep traces/azure_conv_1k.yaml --rates 0.5,1,2,4 --kv-memory 16GiB\n\n
  minipaged sweep ../shared/traces/sharegpt_lengths_llama2_tokenizer.csv --limit 2000 --model opt-13b
  --gpu a100-40gb --max-model-len 2048 --rates 0.5,1,2,4 --slo normalized-latency=0.4 --plot latency.png\n\n
  minipaged sweep traces/mixed.yaml --config sweep.yaml --ray 10.0.0.5:6379 --json sweep.json --csv sweep.csv
"""
# Options a --config file may set, by their keys there: what the command line gives wins.
FILE_KEYS = ("rates", "strategies", "models", "gpus", "kv_memory", "block_sizes", "prefix_caching", "slo",
             "search_steps", "seed", "limit", "time_scale", "trace_format", "max_model_len", "max_num_seqs",
             "max_batched_tokens", "watermark", "preemption", "cpu_blocks", "gpu_memory_utilization", "calibration")


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
    block_sizes: Annotated[str, typer.Option("--block-sizes", "--block-size", help="Tokens per KV block.")] = "16",
    prefix_caching: Annotated[str, typer.Option(
        "--prefix-caching", help="off, on, or off,on (paged only; the other strategies ignore it).")] = "off",
    slo: Annotated[list[str] | None, typer.Option(
        "--slo", help="NAME=SECONDS, repeatable; NAME: " + ", ".join(SLO_METRICS) + " (mean unless -p99). "
                      "Searches the highest rate meeting every SLO.", show_default=False)] = None,
    search_steps: Annotated[int, typer.Option("--search-steps", help="Bisection rounds after the grid.")] = 5,
    workers: Annotated[int | None, typer.Option(
        "--workers", help="Local worker processes. Default: every core.", show_default=False)] = None,
    ray: Annotated[str | None, typer.Option(
        "--ray", help="Run the points as Ray tasks on an existing cluster: HOST:PORT, or no value (auto: "
                      "RAY_ADDRESS or the cluster started on this machine). Needs pip install -e \".[ray]\".",
        metavar="[ADDRESS]", show_default=False)] = None,
    config: Annotated[Path | None, typer.Option(
        "--config", help="A YAML sweep file whose keys name these options (rates: [1, 2], slo: "
                         "{normalized-latency: 0.2}, ...).", metavar="YAML", show_default=False)] = None,
    trace_format: FormatOpt = "auto",
    seed: SeedOpt = 0,
    limit: LimitOpt = None,
    time_scale: TimeScaleOpt = 1.0,
    max_model_len: MaxModelLenOpt = None,
    max_num_seqs: Annotated[int, typer.Option("--max-num-seqs", help="Most requests running at once.")] = 256,
    max_batched_tokens: Annotated[int | None, typer.Option(
        "--max-batched-tokens", help="Chunked prefill: tokens per step.", show_default=False)] = None,
    watermark: WatermarkOpt = 0.01,
    preemption: Annotated[str, typer.Option("--preemption", help="recompute or swap.")] = "recompute",
    cpu_blocks: Annotated[int, typer.Option("--cpu-blocks", help="Swap space, in blocks.")] = 0,
    gpu_memory_utilization: GpuUtilOpt = 0.9,
    calibration: CalibrationOpt = None,
    json_path: JsonOpt = None,
    csv_path: Annotated[Path | None, typer.Option("--csv", help="Write one row per point as CSV.", metavar="PATH",
                                                  show_default=False)] = None,
    plot: PlotOpt = None,
) -> None:
    """Replay a trace at every combination of request rates, strategies and the other axes (models, GPUs, KV
    memory, block sizes, prefix caching), and report per point the normalized latency (end-to-end latency per
    output token, mean and p99), TTFT, TPOT, batch size, throughput, preemptions and token-state share. With
    --slo, the highest request rate each strategy sustains and paged's ratio to each baseline."""
    values = {k: v for k, v in locals().items() if k in FILE_KEYS}
    if config is not None:
        values.update({k: v for k, v in _read_config(config).items()
                       if _source(ctx, k) != "COMMANDLINE"})
    if values["rates"] is None:
        raise InputError("give the request rates to sweep (--rates 1,2,4 or rates: in --config)", field="--rates")
    axes = Axes(rates=_list(values["rates"], float, "--rates"),
                strategies=_list(values["strategies"], str, "--strategies"),
                models=_list(values["models"], str, "--models"), gpus=_list(values["gpus"], str, "--gpus"),
                kv_memory=_list(values["kv_memory"], _kv_memory, "--kv-memory") if values["kv_memory"] else (None,),
                block_sizes=_list(values["block_sizes"], int, "--block-sizes"),
                prefix_caching=_list(values["prefix_caching"], _on_off, "--prefix-caching"))
    for name in axes.strategies:
        if name not in STRATEGIES:
            raise InputError(f"unknown strategy; expected some of {', '.join(STRATEGIES)}", field="--strategies",
                             value=name, has_value=True)
    slos = tuple(parse_slo(s) for s in _slo_texts(values["slo"]))
    if values["search_steps"] < 0 or (workers is not None and workers < 1):
        bad = ("--search-steps", values["search_steps"]) if values["search_steps"] < 0 else ("--workers", workers)
        raise InputError("must be >= 0" if bad[0] == "--search-steps" else "must be >= 1", field=bad[0],
                         value=bad[1], has_value=True)
    settings = Settings(seed=values["seed"], max_model_len=values["max_model_len"],
                        max_num_seqs=values["max_num_seqs"], max_batched_tokens=values["max_batched_tokens"],
                        watermark=values["watermark"], preemption=values["preemption"],
                        cpu_blocks=values["cpu_blocks"], gpu_memory_utilization=values["gpu_memory_utilization"],
                        calibration=str(values["calibration"]) if values["calibration"] else None)
    trace = load_trace(trace_path, values["trace_format"], limit=values["limit"], time_scale=values["time_scale"])
    work = prepare(trace, settings, axes.points())  # bad input ends here, before any progress bar
    runner = RayRunner(ray) if ray is not None else LocalRunner(workers)

    progress = Progress(TextColumn("points"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        TextColumn("left"), TimeRemainingColumn(), console=stderr, transient=True)
    with progress:
        task = progress.add_task("points", total=len(axes.points()))
        result = sweep(trace, axes, settings, runner, slos, values["search_steps"],
                       progress=lambda done, total: progress.update(task, completed=done, total=total), work=work)

    console = tables_console(json_path)
    console.print(f"[bold]{trace.name}[/]: {trace.num_requests} requests · {len(result.rows)} points on "
                  f"{runner.describe()}")
    console.print(points_table(result))
    if slos:
        console.print(capacity_table(result))
        if any(c.status == "above grid" for c in result.capacities or []):
            console.print("[dim]>= : the SLOs still held at the highest rate; add higher --rates to find the limit[/]")
    if json_path is not None:
        write_json(result.to_dict(), json_path, stdout)
    if csv_path is not None:
        write_csv(result, csv_path)
    if plot is not None:
        from minipaged_cli.cli.plot import plot_sweep

        plot_sweep(result, Path(plot), title=f"{trace.name}: normalized latency against request rate")
        console.print(f"plot: {plot}")


def _source(ctx: typer.Context, name: str) -> str:
    """Where an option's value came from, by name (Typer may vendor click, with its own ParameterSource)."""
    source = ctx.get_parameter_source(name)
    return source.name if source is not None else "DEFAULT"


def _read_config(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise InputError(f"cannot read: {str(error).splitlines()[0]}", source=str(path)) from None
    if not isinstance(data, dict):
        raise InputError("expected a mapping of option names to values", source=str(path))
    data = {str(k).replace("-", "_"): v for k, v in data.items()}
    unknown = sorted(set(data) - set(FILE_KEYS))
    if unknown:
        raise InputError(f"unknown key; expected some of {', '.join(FILE_KEYS)}", source=str(path), field=unknown[0])
    return data


def _list(value: Any, kind: type | Any, option: str) -> tuple[Any, ...]:
    """A comma-separated string (command line) or a list (--config), each item converted by ``kind``."""
    items = [s.strip() for s in value.split(",")] if isinstance(value, str) else list(value) \
        if isinstance(value, list | tuple) else [value]
    items = [item for item in items if item != ""]
    if not items:
        raise InputError("name at least one value", field=option, value=value, has_value=True)
    try:
        converted = tuple(kind(item) for item in items)
    except (TypeError, ValueError):
        raise InputError(f"expected {getattr(kind, '__name__', 'a value')} values", field=option, value=value,
                         has_value=True) from None
    if len(set(converted)) != len(converted):
        raise InputError("values must be distinct", field=option, value=value, has_value=True)
    return converted


def _kv_memory(item: Any) -> str | None:
    """A size (16GiB), or default: the GPU's memory times --gpu-memory-utilization, minus the weights."""
    return None if str(item).lower() == "default" else str(item)


def _on_off(item: Any) -> bool:
    if isinstance(item, bool):
        return item
    if str(item).lower() in ("on", "true"):
        return True
    if str(item).lower() in ("off", "false"):
        return False
    raise ValueError(item)


def _slo_texts(value: Any) -> list[str]:
    if isinstance(value, dict):  # from --config: {name: seconds}
        return [f"{k}={v}" for k, v in value.items()]
    return list(value or [])


def _label(result: SweepResult, point: Any) -> str:
    parts = [_value(name, getattr(point, name)) for name in result.axes.varying()]
    return " ".join([point.strategy, *parts])


def _value(name: str, value: Any) -> str:
    if name == "kv_memory":
        return f"KV {value or 'default'}"
    if name == "prefix_caching":
        return "prefix caching" if value else "no prefix caching"
    if name == "block_size":
        return f"block {value}"
    return str(value)


def points_table(result: SweepResult) -> Table:
    table = Table(title="Points (latencies in simulated seconds; normalized: end-to-end latency per output token)",
                  title_justify="left", box=box.SIMPLE_HEAD)
    columns = ["curve", "rate/s", "norm lat mean/p99 s", "TTFT mean/p99 s", "TPOT ms", "batch", "tok/s",
               "preempt", "tok st %"]
    for column in columns:
        table.add_column(column, justify="left" if column == "curve" else "right", no_wrap=True)
    for point in sorted(result.rows, key=lambda p: p.sort_key()):
        row = result.rows[point]
        table.add_row(_label(result, point), f"{point.rate:g}",
                      _pair(row["normalized_latency_mean_s"], row["normalized_latency_p99_s"], "{:.3f}"),
                      _pair(row["ttft_mean_s"], row["ttft_p99_s"], "{:.2f}"),
                      "-" if row["tpot_mean_s"] is None else f"{row['tpot_mean_s'] * 1e3:.1f}",
                      f"{row['mean_batch_size']:.1f}", f"{row['throughput_tokens_per_s']:,.0f}",
                      f"{row['num_preemptions']:,}", f"{row['token_state_pct']:.1f}")
    return table


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
            rate = f">= {capacity.bracket[0]:.3g}"
        else:
            rate = f"{capacity.rate:.3g}"
        high = "-" if capacity.bracket[1] is None else f"{capacity.bracket[1]:.3g}"
        table.add_row(_label(result, curve), rate, f"{capacity.bracket[0]:.3g}, {high}",
                      "" if curve.strategy == "paged" else _ratio(ratio))
    return table


def _ratio(ratio: dict[str, Any]) -> str:
    if ratio["ratio"] is None:
        return "-"
    return f"{'' if ratio['exact'] else '>= '}{ratio['ratio']:.2f}x"


def write_csv(result: SweepResult, path: Path) -> None:
    rows = result.points()
    try:
        with open(path, "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    except OSError as error:
        raise InputError(f"cannot write: {error.strerror}", field="--csv", value=str(path), has_value=True) from None
