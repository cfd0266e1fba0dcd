"""``parity/run.sh TRACE [options]``: replay a trace through vLLM's real v1 scheduler and through minipaged's paged
replay with the same settings and clock, print them side by side, and say where they first differ.

Exit status: 0 when every step's decisions are identical, 1 when they differ, 2 on bad input.
``--table CASES.yaml`` runs a list of cases (each a mapping of ``ParityCase`` fields) and prints one Markdown row
per case, for the README's parity table.
Run it through ``parity/run.sh``, which builds the reference venv and runs this with its python.
"""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from minipaged_cli.cli.common import (
    BlockSizeOpt,
    FormatOpt,
    GpuOpt,
    LimitOpt,
    MaxModelLenOpt,
    ModelOpt,
    RateOpt,
    SeedOpt,
    TimeScaleOpt,
    WatermarkOpt,
    handle_errors,
)
from minipaged_cli.errors import InputError
from minipaged_cli.input_files import read_yaml
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.workloads.trace import Trace
from parity.steps import (
    COMPARED_FIELDS,
    ParityCase,
    ReplayRecord,
    StepRecord,
    first_difference,
    first_difference_by_field,
    minipaged_steps,
)

stdout = Console(width=200)
CONTEXT_STEPS = 3  # steps shown either side of the first difference


@dataclasses.dataclass
class CaseResult:
    case: ParityCase
    vllm: ReplayRecord
    minipaged: ReplayRecord
    first_difference: int | None
    seconds: float


def run_case(case: ParityCase, trace: Trace, config: SimConfig) -> CaseResult:
    """Both replays of ``case``, whose trace and configuration (``case.load()``) the caller read."""
    # Imported here, not at the top: importing vLLM takes tens of seconds, and bad input should fail at once.
    from parity.vllm_side import vllm_steps

    started = time.perf_counter()
    vllm = vllm_steps(trace, config)
    ours = minipaged_steps(trace, config)
    return CaseResult(case, vllm, ours, first_difference(vllm.steps, ours.steps), time.perf_counter() - started)


def format_scheduled(scheduled: dict[str, int]) -> str:
    """Chunks by request, then the one-token steps (decodes) as a count: a batch of 256 decodes stays one line."""
    chunks = [f"{key}:{tokens}" for key, tokens in scheduled.items() if tokens > 1]
    ones = sum(tokens == 1 for tokens in scheduled.values())
    return " ".join(chunks + ([f"{ones}x1"] if ones else []))


def describe_difference(a: StepRecord | None, b: StepRecord | None) -> str:
    """What differs between vLLM's step ``a`` and minipaged's ``b``, field by field."""
    if a is None or b is None:
        return "only vLLM has this step" if b is None else "only minipaged has this step"
    vllm_fields, minipaged_fields = a.compared(), b.compared()
    parts = []
    for name in COMPARED_FIELDS:
        if vllm_fields[name] == minipaged_fields[name]:
            continue
        if name == "scheduled":
            only_vllm = {k: v for k, v in a.scheduled.items() if b.scheduled.get(k) != v}
            only_ours = {k: v for k, v in b.scheduled.items() if a.scheduled.get(k) != v}
            parts.append(f"scheduled: vLLM {format_scheduled(only_vllm) or '-'} / minipaged "
                         f"{format_scheduled(only_ours) or '-'}")
        else:
            parts.append(f"{name}: vLLM {vllm_fields[name]} / minipaged {minipaged_fields[name]}")
    return "; ".join(parts)


def _side_by_side(a: StepRecord | None, b: StepRecord | None, name: str) -> str:
    """One field of both steps: once when equal, else "vLLM's / minipaged's"."""
    values = []
    for step in (a, b):
        value = getattr(step, name) if step is not None else "-"
        values.append(" ".join(value) if isinstance(value, list) else str(value))
    return values[0] if values[0] == values[1] else f"{values[0]} / {values[1]}"


def steps_table(result: CaseResult, indices: range) -> Table:
    table = Table(title=f"steps {indices.start}..{indices.stop - 1} (vLLM / minipaged)", show_lines=False)
    for column in ("step", "t (s)", "vLLM scheduled", "minipaged scheduled", "preempted", "finished",
                   "hits", "blocks used", "difference"):
        table.add_column(column, overflow="fold")
    vllm, ours = result.vllm.steps, result.minipaged.steps
    for index in indices:
        a = vllm[index] if index < len(vllm) else None
        b = ours[index] if index < len(ours) else None
        differs = a is None or b is None or a.compared() != b.compared()
        table.add_row(str(index), f"{(a or b).time_s:.4f}",
                      format_scheduled(a.scheduled) if a else "-", format_scheduled(b.scheduled) if b else "-",
                      *(_side_by_side(a, b, name) for name in ("preempted", "finished", "prefix_hits", "used_blocks")),
                      describe_difference(a, b) if differs else "", style="bold red" if differs else None)
    return table


def totals_table(result: CaseResult) -> Table:
    table = Table(title=f"{result.case.label}: totals")
    from vllm import __version__ as vllm_version  # (the venv's release: parity/setup_env.sh)

    for column in ("", f"vLLM {vllm_version}", "minipaged"):
        table.add_column(column, justify="right")
    ours = result.minipaged.totals()
    for name, value in result.vllm.totals().items():
        table.add_row(name, *(f"{v:.4f}" if isinstance(v, float) else str(v) for v in (value, ours[name])))
    return table


def verdict(result: CaseResult) -> str:
    if result.first_difference is None:
        return f"identical: {result.vllm.num_steps} steps, every decision the same"
    index = result.first_difference
    a = result.vllm.steps[index] if index < result.vllm.num_steps else None
    b = result.minipaged.steps[index] if index < result.minipaged.num_steps else None
    by_field = first_difference_by_field(result.vllm.steps, result.minipaged.steps)
    fields = ", ".join(f"{name} at step {step}" for name, step in sorted(by_field.items(), key=lambda item: item[1]))
    return (f"first difference at step {index} (t = {(a or b).time_s:.4f} s): {describe_difference(a, b)}"
            + (f" [first differences by field: {fields}]" if fields else ""))


def table_row(result: CaseResult) -> str:
    """One Markdown row: the case, then vLLM / minipaged for steps, preemptions, hit rate and usage."""
    vllm, ours = result.vllm, result.minipaged
    cells = [result.case.label,
             f"{vllm.num_steps} / {ours.num_steps}",
             f"{vllm.num_preemptions} / {ours.num_preemptions}",
             f"{100 * vllm.prefix_hit_rate:.2f} % / {100 * ours.prefix_hit_rate:.2f} %"
             if result.case.prefix_caching else "-",
             f"{100 * vllm.mean_usage:.1f} % / {100 * ours.mean_usage:.1f} %",
             "yes" if result.first_difference is None else f"no (step {result.first_difference})"]
    return "| " + " | ".join(cells) + " |"


TABLE_HEADER = ("| case | steps | preemptions | prefix hit rate | mean KV usage | identical |\n"
                "|---|---|---|---|---|---|")


def read_cases(path: Path) -> list[ParityCase]:
    """A YAML list of mappings of ``ParityCase`` fields; relative trace paths are relative to the file."""
    raw = read_yaml(path)
    if not isinstance(raw, list) or not raw:
        raise InputError("expected a non-empty list of cases", source=str(path))
    names = {f.name for f in dataclasses.fields(ParityCase)}
    cases = []
    for number, entry in enumerate(raw, 1):
        if not isinstance(entry, dict) or "trace" not in entry:
            raise InputError("expected a mapping with a 'trace'", source=f"{path}: case {number}")
        unknown = sorted(set(entry) - names)
        if unknown:
            raise InputError(f"unknown field; expected some of {', '.join(sorted(names))}",
                             source=f"{path}: case {number}", field=unknown[0])
        entry = dict(entry, trace=str((path.parent / entry["trace"]).resolve()))
        cases.append(ParityCase(**entry))
    return cases


def main(
    trace: Annotated[Path | None, typer.Argument(help="A trace `minipaged simulate` reads.", show_default=False)]
    = None,
    trace_format: FormatOpt = "auto",
    num_blocks: Annotated[int, typer.Option("--num-blocks", help="KV blocks (vLLM gets one more: its null block).")]
    = 2000,
    block_size: BlockSizeOpt = 16,
    max_batched_tokens: Annotated[int, typer.Option("--max-batched-tokens", help="Token budget per step.")] = 8192,
    max_num_seqs: Annotated[int, typer.Option("--max-num-seqs", help="Most requests running at once.")] = 256,
    max_model_len: MaxModelLenOpt = None,
    prefix_caching: Annotated[bool, typer.Option("--prefix-caching/--no-prefix-caching")] = False,
    watermark: WatermarkOpt = 0.0,
    limit: LimitOpt = None,
    time_scale: TimeScaleOpt = 1.0,
    rate: RateOpt = None,
    seed: SeedOpt = 0,
    model: ModelOpt = "qwen3-8b",
    gpu: GpuOpt = "h200",
    scheduler: Annotated[str, typer.Option("--scheduler", help="minipaged's scheduling: v1 (compared) or v0 "
                                                               "(the old engine, to see where it parts).")] = "v1",
    steps: Annotated[bool, typer.Option("--steps", help="Print every step, not only around the first "
                                                        "difference.")] = False,
    table: Annotated[Path | None, typer.Option("--table", help="Run the cases of this YAML list; print a "
                                                               "Markdown row per case.", show_default=False)] = None,
) -> None:
    """Replay TRACE through vLLM's v1 scheduler and minipaged's paged replay; print both, step by step."""
    run(trace, table, steps, dict(
        trace_format=trace_format, num_blocks=num_blocks, block_size=block_size,
        max_batched_tokens=max_batched_tokens, max_num_seqs=max_num_seqs, max_model_len=max_model_len,
        prefix_caching=prefix_caching, watermark=watermark, limit=limit, time_scale=time_scale, rate=rate,
        seed=seed, model=model, gpu=gpu, scheduler=scheduler))


@handle_errors
def run(trace: Path | None, table: Path | None, steps: bool, options: dict[str, Any]) -> None:
    if (trace is None) == (table is None):
        raise InputError("give a TRACE or --table CASES.yaml, not both", field="TRACE")
    if table is not None:
        # Bad input in any case fails before the first replay; each trace is read once.
        cases = [(case, *case.load()) for case in read_cases(table)]
        stdout.print(TABLE_HEADER)
        identical = True
        for case, case_trace, config in cases:
            result = run_case(case, case_trace, config)
            identical &= result.first_difference is None
            stdout.print(table_row(result), soft_wrap=True)
            stdout.print(f"<!-- {verdict(result)} ({result.seconds:.1f} s) -->", soft_wrap=True, markup=False)
        raise typer.Exit(0 if identical else 1)
    case = ParityCase(trace=str(trace), **options)
    result = run_case(case, *case.load())
    if steps:
        shown = range(max(result.vllm.num_steps, result.minipaged.num_steps))
    elif result.first_difference is not None:
        index = result.first_difference
        shown = range(max(index - CONTEXT_STEPS, 0), index + CONTEXT_STEPS + 1)
        shown = range(shown.start, min(shown.stop, max(result.vllm.num_steps, result.minipaged.num_steps)))
    else:
        shown = range(0)
    if shown:
        stdout.print(steps_table(result, shown))
    stdout.print(totals_table(result))
    stdout.print(verdict(result), soft_wrap=True, markup=False)
    raise typer.Exit(0 if result.first_difference is None else 1)


if __name__ == "__main__":
    typer.run(main)
