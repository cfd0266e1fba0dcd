"""``minipaged calibrate OUT.yaml``: step times measured on this machine's GPU (or converted from a public
profile), for ``simulate --calibration``."""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich import box
from rich.table import Table

from minipaged_cli.cli.common import (
    DeviceOpt,
    GpuOpt,
    JsonOpt,
    ModelOpt,
    check_dtype,
    flag,
    handle_errors,
    require_per_head_kv,
    require_support,
    stderr,
    stdout,
    tables_console,
)
from minipaged_cli.cli.outputs import STDOUT, check_outputs, write_text
from minipaged_cli.cli.render import write_json
from minipaged_cli.errors import InputError
from minipaged_cli.sim.calibration import Calibration
from minipaged_cli.sim.calibration import Table as TimeTable
from minipaged_cli.sim.step_time import StepTimeModel, causal_pairs
from minipaged_cli.workloads.presets import load_gpu, load_model

if TYPE_CHECKING:
    from minipaged_cli.apps.host_link import HostLink

EPILOG = """\
Examples:\n\n
  minipaged calibrate h200-qwen3-8b.yaml --model qwen3-8b --gpu h200 --device cuda\n\n
  minipaged calibrate cpu.yaml --model qwen3-0.6b --device cpu --quick\n\n
  minipaged calibrate h100.yaml --model llama-2-7b --gpu h100 --from-vidur tests/data/vidur_h100_llama-2-7b_mlp.csv
"""


@handle_errors
def calibrate_command(
    out: Annotated[str, typer.Argument(help="The calibration YAML to write ('-': stdout).", metavar="OUT",
                                       show_default=False)],
    model: ModelOpt = "qwen3-8b",
    gpu: GpuOpt = "h200",
    device: DeviceOpt = "auto",
    dtype: Annotated[str | None, typer.Option("--dtype", help="Weights' and K/V's dtype. Default: the model's.",
                                              show_default=False)] = None,
    quick: Annotated[bool, flag(
        "quick", help="A few points per table (seconds on a CPU) instead of the full grid (for a GPU).")] = False,
    repeat: Annotated[int, typer.Option("--repeat", help="Timed calls per point (the median counts).")] = 5,
    from_vidur: Annotated[Path | None, typer.Option(
        "--from-vidur", help="Convert a Vidur profile (its mlp.csv: the GEMMs and element-wise kernels of a "
        "layer) instead of measuring.",
        metavar="CSV", show_default=False)] = None,
    source: Annotated[str | None, typer.Option(
        "--source", help="Where the numbers come from, written into the file (default: how they were made).",
        show_default=False)] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the random weights and K/V.")] = 0,
    host_link: Annotated[bool, flag(
        "host-link", help="Also time copies between the device and host memory (each way, pinned and pageable, "
                          "4 KiB-256 MiB): the link KV offloading and swapping move blocks over.")] = True,
    gpu_out: Annotated[str | None, typer.Option(
        "--gpu-out", help="Write the --gpu preset as a GPU YAML with host_bandwidth_bytes_per_s measured (for "
                          "simulate --gpu GPU.yaml).", metavar="GPU.yaml", show_default=False)] = None,
    json_path: JsonOpt = None,
) -> None:
    """Measure one layer of the model (weight GEMMs, element-wise kernels, prefill and decode attention, cache
    writes) over a grid of token counts, batch sizes and context lengths up to the model's context length, and
    write the tables `simulate --calibration` interpolates. Prints each table's measured times against the GPU
    preset's efficiency model, and says which tables end short of the context length."""
    from minipaged_cli.apps.vidur import from_vidur as convert

    check_outputs({"OUT": out, "--json": json_path, "--gpu-out": gpu_out})
    spec, gpu_spec = load_model(model), load_gpu(gpu)
    if repeat < 1:
        raise InputError("must be >= 1", field="--repeat", value=repeat, has_value=True)
    if gpu_out is not None and (from_vidur is not None or not host_link):
        raise InputError("needs the host link measured (not --from-vidur, not --no-host-link)", field="--gpu-out",
                         value=gpu_out, has_value=True)
    link = None
    if from_vidur is not None:
        calibration = convert(from_vidur, spec, gpu_spec.name)
        header = f"{gpu_spec.name}, {spec.name}: converted by minipaged calibrate --from-vidur {from_vidur.name}"
    else:
        import torch

        from minipaged_cli.apps.calibrate import QUICK_GRID, coverage, full_grid, measure
        from minipaged_cli.apps.host_link import LINK_SIZES, QUICK_LINK_SIZES, measure_host_link
        from minipaged_cli.dataplane.select import select_backend

        require_per_head_kv(spec, "simulate times its steps with the GPU's efficiency model")
        backend = select_backend(device)
        require_support(backend, spec.num_q_heads, spec.num_kv_heads, spec.head_dim, spec.name)
        torch_dtype = getattr(torch, check_dtype(dtype or spec.dtype))
        if backend.device.type != "cuda":
            stderr.print(f"note: measuring on {backend.device} ({backend.name}), not on a GPU: the file says so, "
                         f"but simulate will take it as {gpu_spec.name}'s", markup=False)
        with stderr.status("calibrating") as status:
            calibration = measure(spec, gpu_spec.name, backend, torch_dtype, QUICK_GRID if quick else full_grid(spec),
                                  repeat, seed, progress=lambda what: status.update(f"calibrating: {what}"))
            if host_link:
                status.update("calibrating: the host link")
                link = measure_host_link(backend.device, QUICK_LINK_SIZES if quick else LINK_SIZES, repeat)
        header = f"{gpu_spec.name}, {spec.name}: measured by minipaged calibrate"
        for note in coverage(calibration):
            stderr.print(f"note: {note}", markup=False)
    if source is not None:
        calibration = replace(calibration, source=source)
    text = calibration.to_yaml(header)
    if out == STDOUT:
        sys.stdout.write(text)
    else:
        write_text(out, text, "OUT")

    rows = comparison(calibration, StepTimeModel(spec, gpu_spec))
    console = stderr if out == "-" else tables_console(json_path)
    table = Table(title=f"Measured against {gpu_spec.name}'s efficiency model, one layer", title_justify="left",
                  box=box.SIMPLE_HEAD)
    for column in ("table", "points", "at", "measured µs", "model µs", "measured / model"):
        table.add_column(column, justify="left" if column in ("table", "at") else "right")
    for row in rows:
        table.add_row(row["table"], str(row["points"]), row["at"], f"{row['measured_us']:,.1f}",
                      f"{row['model_us']:,.1f}", f"{row['ratio']:.2f}")
    console.print(table)
    if link is not None:
        console.print(link_table(link))
    if out != "-":
        console.print(f"wrote {out}", markup=False)
    if gpu_out is not None and link is not None:
        from minipaged_cli.apps.host_link import gpu_yaml

        write_text(gpu_out, gpu_yaml(gpu_spec, link), "--gpu-out")
        console.print(f"wrote {gpu_out} (host_bandwidth_bytes_per_s {link.bandwidth_bytes_per_s:.4g})", markup=False)
    if json_path is not None:
        write_json({"calibration": out, "gpu": calibration.gpu, "model": spec.name, "source": calibration.source,
                    "comparison": rows, "host_link": link.to_dict() if link is not None else None}, json_path,
                   stdout)


def link_table(link: HostLink) -> Table:
    """GB/s of one copy per size, each direction, pinned and pageable where both were measured."""
    where = (f"{link.device}, PCIe" if link.is_pcie else
             f"{link.device}: both ends are host memory, so these are memcpy, not a PCIe link")
    table = Table(title=f"Host link on {where} (GB/s of one copy, median)", title_justify="left",
                  box=box.SIMPLE_HEAD)
    table.add_column("copy", justify="right")
    keys = list(link.seconds)
    for direction, pinned in keys:
        table.add_column(f"{'H2D' if direction == 'host_to_device' else 'D2H'} "
                         f"{'pinned' if pinned else 'pageable'}", justify="right")
    columns = [link.gbps(*key) for key in keys]
    for i, size in enumerate(link.sizes):
        table.add_row(f"{size / 2**10:,.0f} KiB", *(f"{column[i]:.2f}" for column in columns))
    return table


def comparison(calibration: Calibration, model: StepTimeModel) -> list[dict[str, object]]:
    """Each table's smallest and largest point, measured and as the efficiency model predicts (per layer)."""
    spec = calibration.model
    layers = spec.num_layers
    rows: list[dict[str, object]] = []

    def add(name: str, points: int, at: str, measured: float, predicted: float) -> None:
        rows.append({"table": name, "points": points, "at": at, "measured_us": measured * 1e6,
                     "model_us": predicted * 1e6, "ratio": measured / predicted})

    def add_table(name: str, table: TimeTable | None, predict: Callable[[int], Any]) -> None:
        if table is not None:
            for i in (0, -1):
                tokens = int(table.sizes[i])
                add(name, len(table.sizes), f"{tokens} tokens", table.seconds[i], float(predict(tokens)) / layers)

    add_table("linear", calibration.linear, model.linear_seconds)
    add_table("element-wise", calibration.elementwise, model.elementwise_seconds)
    add_table("prefill attention", calibration.prefill_attention,
              lambda n: model.prefill_attention_seconds(n, causal_pairs(n), n))
    if calibration.decode_attention is not None:
        grid = calibration.decode_attention
        for i, j in ((0, 0), (-1, -1)):
            batch, context = int(grid.batch[i]), int(grid.context[j])
            add("decode attention", grid.seconds.size, f"{batch} x {context} tokens", grid.seconds[i, j],
                float(model.decode_attention_seconds(batch, batch * context)) / layers)
    add_table("cache write", calibration.cache_write, model.cache_write_seconds)
    return rows
