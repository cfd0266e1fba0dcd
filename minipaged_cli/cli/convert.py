"""``minipaged convert SRC OUT.yaml``: a public trace (or a slice of one) into the YAML trace format."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from minipaged_cli.cli.common import (
    FormatOpt,
    LimitOpt,
    RateOpt,
    SeedOpt,
    TimeScaleOpt,
    TraceArg,
    handle_errors,
    stdout,
)
from minipaged_cli.cli.outputs import check_outputs, write_text
from minipaged_cli.cli.workload_options import TokenizerOpt
from minipaged_cli.errors import InputError
from minipaged_cli.workloads.readers import load_trace
from minipaged_cli.workloads.trace import dump_trace

EPILOG = """\
Examples:\n\n
  minipaged convert ../shared/traces/AzureLLMInferenceTrace_conv.csv traces/azure_conv_1k.yaml --limit 1000\n\n
  minipaged convert ../shared/traces/mooncake_conversation_trace.jsonl mooncake_200.yaml --limit 200
"""


@handle_errors
def convert_command(
    trace_path: TraceArg,
    output: Annotated[Path, typer.Argument(help="YAML file to write.", metavar="OUTPUT", show_default=False)],
    trace_format: FormatOpt = "auto",
    rate: RateOpt = None,
    seed: SeedOpt = 0,
    limit: LimitOpt = None,
    time_scale: TimeScaleOpt = 1.0,
    tokenizer: TokenizerOpt = None,
    note: Annotated[str, typer.Option("--note", help="Extra comment lines for the file's header "
                                                     "(source, license, attribution).")] = "",
) -> None:
    """Convert a trace (Azure CSV, Mooncake JSONL, lengths CSV, AIPerf JSONL, ShareGPT conversations, or a
    genai-perf, inference-perf, vLLM multi-turn or prefix-repetition config) into the YAML format, sessions
    included, optionally a slice of it (--limit) or re-timed (--rate, --time-scale); the header records where it
    came from."""
    if output.suffix.lower() not in (".yaml", ".yml"):
        raise InputError("the output must be a .yaml file", field="OUTPUT", value=str(output), has_value=True)
    check_outputs({"OUTPUT": output})
    trace = load_trace(trace_path, trace_format, rate=rate, seed=seed, limit=limit, time_scale=time_scale,
                       tokenizer=tokenizer)
    options = " ".join(
        part for part in (
            f"--trace-format {trace_format}" if trace_format != "auto" else "",
            f"--limit {limit}" if limit is not None else "",
            f"--rate {rate:g} --seed {seed}" if rate is not None else "",
            f"--time-scale {time_scale:g}" if time_scale != 1.0 else "",
            f"--tokenizer {tokenizer.name}" if tokenizer is not None else "",
        ) if part
    )
    header = "\n".join(line for line in (
        f"Converted by: minipaged convert {trace_path.name} {output.name}{' ' + options if options else ''}",
        f"Source: {trace.description}" if trace.description else "",
        note,
    ) if line)
    write_text(output, dump_trace(trace, header=header), "OUTPUT")
    sessions = f" in {len(trace.sessions)} sessions" if trace.sessions else ""
    stdout.print(f"wrote {output}: {trace.num_requests} requests{sessions}, {trace.prompt_tokens:,} prompt + "
                 f"{trace.output_tokens:,} output tokens, {len(trace.segments)} shared segments", markup=False)
