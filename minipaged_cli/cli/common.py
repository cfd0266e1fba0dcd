"""What every command shares: option aliases, the error policy (exit 2 on bad input, 1 on a bug), consoles."""

from __future__ import annotations

import functools
import importlib.util
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console

from minipaged_cli.cli.flags import error_line, note_line
from minipaged_cli.errors import InputError
from minipaged_cli.extras import FallbackWarning, missing_extra, needs
from minipaged_cli.sim.vllm_releases import VLLM_RELEASES
from minipaged_cli.workloads.formats import TRACE_FORMATS

if TYPE_CHECKING:
    from minipaged_cli.sim.calibration import Calibration
    from minipaged_cli.workloads.presets import ModelSpec


def _console(to_stderr: bool) -> Console:
    """A console on stdout or stderr. Piped output is not cut to 80 columns: tables stay whole in files and CI logs.
    Without colours (piped), the highlighter's styles would print nothing: it is off then (compiling its regular
    expressions costs a few milliseconds at the first print)."""
    probe = Console(stderr=to_stderr)
    return Console(stderr=to_stderr, width=None if probe.is_terminal else 150, highlight=probe.color_system is not None)


stdout = _console(to_stderr=False)
stderr = _console(to_stderr=True)

F = TypeVar("F", bound=Callable[..., Any])


def handle_errors(command: F) -> F:
    """Bad input, or an optional dependency the command needs and that is not installed -> one line on stderr
    and exit 2; any other exception -> one line and exit 1 (``MINIPAGED_DEBUG=1`` re-raises it with its
    traceback). Notes of the library (``FallbackWarning``) -> one 'note:' line each, as they happen."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("always", FallbackWarning)
                warnings.showwarning = functools.partial(_show_warning, warnings.showwarning)
                return command(*args, **kwargs)
        except InputError as error:
            stderr.print(f"error: {error_line(error)}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except (typer.Exit, typer.Abort):
            raise
        except Exception as error:
            missing = missing_extra(error)
            if missing is not None:
                stderr.print(f"error: this command {missing}", markup=False, highlight=False, soft_wrap=True)
                raise typer.Exit(2) from None
            if os.environ.get("MINIPAGED_DEBUG"):
                raise
            stderr.print(f"internal error: {type(error).__name__}: {error} (MINIPAGED_DEBUG=1 shows the traceback)",
                         markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(1) from None

    return wrapper  # type: ignore[return-value]


def _show_warning(default: Callable[..., None], message: Warning | str, category: type[Warning], *args: Any,
                  **kwargs: Any) -> None:
    """A ``FallbackWarning`` as one 'note:' line; any other warning as Python shows it."""
    if issubclass(category, FallbackWarning):
        stderr.print(f"note: {note_line(str(message))}", markup=False, highlight=False, soft_wrap=True)
    else:
        default(message, category, *args, **kwargs)


# -- option aliases ----------------------------------------------------------------------------------------


def flag(name: str, help: str) -> Any:
    """A boolean option the way Typer documents it: ``--NAME`` sets it, ``--no-NAME`` clears it."""
    return typer.Option(f"--{name}/--no-{name}", help=help)


TraceArg = Annotated[Path, typer.Argument(help="Request trace: YAML, Azure CSV, Mooncake JSONL or a lengths CSV.",
                                          metavar="TRACE", show_default=False)]
OptionalTraceArg = Annotated[Path | None, typer.Argument(
    help="Request trace: YAML, Azure CSV, Mooncake JSONL or a lengths CSV (none: lists the bundled ones).",
    metavar="[TRACE]", show_default=False)]
# The traces of a source checkout (traces/), for a command run without one.
BUNDLED_TRACES = Path(__file__).resolve().parents[2] / "traces"


def require_trace(path: Path | None, command: str) -> Path:
    """The trace given, or bad input that names the bundled ones to start with."""
    if path is not None:
        return path
    names = sorted(p.name for p in BUNDLED_TRACES.glob("*.yaml")) if BUNDLED_TRACES.is_dir() else []
    bundled = (f"; the bundled ones: {', '.join(f'traces/{n}' for n in names)} "
               f"(minipaged {command} traces/mixed.yaml)") if names else ""
    raise InputError(f"give a request trace (YAML, Azure CSV, Mooncake JSONL or a lengths CSV){bundled}",
                     field="TRACE")


FormatOpt = Annotated[str, typer.Option(
    "--trace-format", help=f"The trace's format: {', '.join(TRACE_FORMATS)} (auto: by its extension and header).")]
RateOpt = Annotated[float | None, typer.Option(
    "--rate", help="Replace arrival times with a seeded Poisson process of this many requests/s "
                   "(length-only CSVs: default all at t=0).", show_default=False)]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of --rate's arrivals.")]
LimitOpt = Annotated[int | None, typer.Option("--limit", help="Keep the first N requests.", show_default=False)]
TimeScaleOpt = Annotated[float, typer.Option(
    "--time-scale", help="Multiply arrival times (0.5 = twice the request rate).")]
ModelOpt = Annotated[str, typer.Option(
    "--model", help="Model preset (configs/models/: qwen3-8b, llama-3.1-8b, llama-3.1-70b, gpt-oss-20b, gpt-oss-120b, "
                    "gemma-3-27b, qwen3-30b-a3b, deepseek-v3, ...) or a Hugging Face config.json path.")]
GpuOpt = Annotated[str, typer.Option(
    "--gpu", help="GPU preset (h200, h100, a100-80gb, a100-40gb) or a YAML of your own with its keys: memory, "
                  "peaks and achieved efficiencies (configs/gpus/).")]
CalibrationOpt = Annotated[Path | None, typer.Option(
    "--calibration", help="Step times measured on the GPU (minipaged calibrate; configs/calibrations/), "
                          "interpolated; default: the GPU preset's efficiency model.", metavar="YAML",
    show_default=False)]
WatermarkOpt = Annotated[float | None, typer.Option(
    "--watermark", help="Paged admission keeps this fraction of the blocks free. Default: v1's 0 "
                        "(vllm/config/scheduler.py; v1 holds it only for waiting requests while something runs); "
                        "v0's 0.01, always (its BlockSpaceManager).", show_default=False)]
SchedulerOpt = Annotated[str, typer.Option(
    "--scheduler", help="The vLLM engine whose scheduling the replay follows: v1 (vLLM today: one token budget a "
                        "step, running requests first, blocks allocated chunk by chunk) or v0 (the vLLM paper's: "
                        "whole prompts reserved at admission, a step that prefills runs no decode, swap preemption, "
                        "forked samples; with --max-batched-tokens, v0's chunked prefill, which mixes them).")]
MaxNumSeqsOpt = Annotated[int | None, typer.Option(
    "--max-num-seqs", help="Most requests running at once. Default: v1, vllm serve's for the GPU (1024 on GPUs "
                           "of 70 GiB or more but the A100, else 256: vllm/engine/arg_utils.py "
                           "EngineArgs.get_batch_defaults); v0, 256.", show_default=False)]
MaxBatchedTokensOpt = Annotated[int | None, typer.Option(
    "--max-batched-tokens", help="Tokens one step computes (vLLM's max_num_batched_tokens; chunked prefill). "
                                 "Default: v1, vllm serve's for the GPU (16384 on GPUs of 160 GiB or more, 8192 "
                                 "on 70 GiB or more but the A100, else 2048); v0, whole prompts, up to "
                                 "max(max-model-len, 2048) prompt tokens a step, in steps without decodes. Given "
                                 "under v0, it turns on v0's chunked prefill: decodes and prompt chunks share a "
                                 "step.", show_default=False)]
PrefixCachingOpt = Annotated[bool | None, flag(
    "prefix-caching", help="Paged only: prompts share cached full blocks of their prefix segments (YAML 'prefix', "
                           "Mooncake hash_ids); reports prefix_cache_hits / queries. Default: on in v1 (vllm "
                           "serve's), off in v0.")]
HybridKvOpt = Annotated[bool | None, flag(
    "hybrid-kv", help="Models with sliding-window layers: vLLM v1's hybrid KV cache manager (a KV cache group per "
                      "attention type; windows free the blocks they no longer see), shown against every layer as "
                      "full attention on the same memory. --no-hybrid-kv: vLLM's --disable-hybrid-kv-cache-manager. "
                      "Default: on in v1, off in v0.")]
LongPrefillOpt = Annotated[int, typer.Option(
    "--long-prefill-threshold", help="v1: most prompt tokens one request prefills a step (vLLM's "
                                     "long_prefill_token_threshold); 0, vllm serve's default: no limit.")]
BlockSizeOpt = Annotated[int | None, typer.Option(
    "--block-size", help="Tokens per KV block. Default: the vLLM release's for the model and GPU (0.34: 64; "
                         "0.33: 16, 64 for latent attention with an fp8 KV cache on Hopper); v0's 16.",
    show_default=False)]
NumBlocksOpt = Annotated[int | None, typer.Option(
    "--num-blocks", help="KV capacity in blocks (instead of --kv-memory).", show_default=False)]
KvMemoryOpt = Annotated[str | None, typer.Option(
    "--kv-memory", help="KV capacity in bytes, e.g. 16GiB. Default: as the vLLM release sizes it: the GPU's "
                        "memory less the weights, the activation peak of a profiling step, CUDA graphs and "
                        "non-torch memory (the GPU preset's).", show_default=False)]
GpuUtilOpt = Annotated[float | None, typer.Option(
    "--gpu-memory-utilization", help="Share of GPU memory vLLM may use when --kv-memory is not given. Default: "
                                     "the vLLM release's (0.34: 1.0, the KV cache sized from the memory free "
                                     "after warmup; 0.33: 0.92).", show_default=False)]
VllmVersionOpt = Annotated[str, typer.Option(
    "--vllm-version", help="The vLLM release whose defaults apply where an option is not given: block size, "
                           "KV sizing, batch limits, scheduler options (docs/vllm-releases.md): "
                           + ", ".join(VLLM_RELEASES) + ".")]
MaxModelLenOpt = Annotated[int | None, typer.Option(
    "--max-model-len", help="Longest request (prompt + output) served; longer ones are rejected and counted. "
                            "Default: the model's.", show_default=False)]
DeviceOpt = Annotated[str, typer.Option(
    "--device", help="auto (the CUDA kernels when a GPU and PyCUDA are there, else cpu, with a note saying why "
                     "when a GPU is there), cpu (the PyTorch reference), cuda, or emulated (the CUDA kernels run on "
                     "the CPU: slow, exact).")]
JsonOpt = Annotated[str | None, typer.Option(
    "--json", help="Write the results as JSON to PATH ('-': stdout, and the tables go to stderr).",
    metavar="PATH", show_default=False)]


def _check_plot(path: Path | None) -> Path | None:
    """A plot asked for fails at once, not after the work, when matplotlib (the [plot] extra) is not installed or
    cannot write the file's format."""
    if path is None:
        return None
    if importlib.util.find_spec("matplotlib") is None:
        raise typer.BadParameter(needs("matplotlib"))
    from matplotlib.backend_bases import FigureCanvasBase

    formats = FigureCanvasBase.get_supported_filetypes()
    suffix = path.suffix.lower().removeprefix(".")
    if suffix and suffix not in formats:
        raise typer.BadParameter(f"matplotlib writes no .{suffix} files; expected .png (or .{', .'.join(formats)})")
    return path


PlotOpt = Annotated[Path | None, typer.Option("--plot", help="Write a PNG plot to this path (the [plot] extra).",
                                              metavar="PNG", show_default=False, callback=_check_plot)]


DTYPES = ("float32", "float16", "bfloat16")


def check_dtype(name: str) -> str:
    """A torch dtype name the data plane supports (``--dtype``)."""
    if name not in DTYPES:
        raise InputError(f"expected one of {', '.join(DTYPES)}", field="--dtype", value=name, has_value=True)
    return name


def require_support(backend: Any, num_q_heads: int, num_kv_heads: int, head_dim: int, model: str,
                    kv_cache_dtype: str = "auto") -> None:
    """Bad input, not a crash, when the chosen backend cannot run the model's attention shape (or KV cache dtype)."""
    reason = backend.unsupported(num_q_heads, num_kv_heads, head_dim, kv_cache_dtype)
    if reason is not None:
        raise InputError(f"{reason} ({model}); use --device cpu", field="--device", value=backend.name,
                         has_value=True)


def require_per_head_kv(spec: ModelSpec, instead: str) -> None:
    """Bad input, not wrong numbers, when the data plane (its cache of per-head K and V) would run a model with
    multi-head latent attention, whose cache holds one latent vector a token (``dataplane/mla.py`` is a reference
    implementation, not a backend)."""
    if spec.is_mla:
        raise InputError(f"multi-head latent attention (a {spec.kv_lora_rank} + {spec.qk_rope_head_dim} latent a "
                         "token) has no kernels in the data plane, which caches per-head K and V; "
                         f"{instead}", field="--model", value=spec.name, has_value=True)


def refuse_options(given: dict[str, object], why: str) -> None:
    """An engine option a command accepts (every engine command takes every engine option) but cannot honour:
    bad input in one line saying why, when it was given (not None, not False)."""
    for option, value in given.items():
        if value is not None and value is not False:
            raise InputError(why, field=option, value=value, has_value=True)


def load_calibration_option(path: Path | None) -> Calibration | None:
    if path is None:
        return None
    from minipaged_cli.sim.calibration import load_calibration  # (NumPy: --help and --version need neither)

    return load_calibration(path)


def tables_console(json_path: str | None) -> Console:
    """Tables go to stdout, unless the JSON does (``--json -``): then to stderr."""
    return stderr if json_path == "-" else stdout


KvCacheDtypeOption = Annotated[str, typer.Option(
    "--kv-cache-dtype", help="KV cache element type, as vLLM's --kv-cache-dtype: auto (the model's dtype), fp8 / "
                             "fp8_e4m3, fp8_e5m2 (1 byte per element: about twice the tokens).")]
