"""One grammar for every command: the help panels options are grouped under, and the old spellings kept for one
release (rewritten to the new ones before parsing, with a one-line note on stderr).

An option's panel is looked up by its parameter's name, so a command module defines options and nothing here needs
to know which command has which; an option missing from ``PANELS`` is shown under "Other options"."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from minipaged_cli.cli.common import stderr

TRACE, MODEL, ENGINE, CACHE, FLEET, OUTPUT, RUN, SETTINGS = (
    "Trace", "Model and GPU", "Engine", "Cache and tiers", "Fleet", "Output", "What to run", "Settings file")

PANELS: dict[str, str] = {
    # the trace (verify: its prompts)
    "trace_path": TRACE, "trace_format": TRACE, "rate": TRACE, "seed": TRACE, "limit": TRACE, "time_scale": TRACE,
    "seq_lens": TRACE, "batch": TRACE, "seq_len": TRACE, "decode_steps": TRACE, "generate": TRACE,
    "tokenizer": TRACE, "clients": TRACE, "concurrency": TRACE, "max_concurrency": TRACE,
    # what runs it
    "model": MODEL, "models": MODEL, "gpu": MODEL, "gpus": MODEL, "calibration": MODEL, "device": MODEL,
    "dtype": MODEL, "model_path": MODEL, "model_config": MODEL, "layer": MODEL, "num_layers": MODEL,
    # the engine: capacity, scheduling, the strategies compared
    "strategies": ENGINE, "kv_memory": ENGINE, "num_blocks": ENGINE, "gpu_memory_utilization": ENGINE,
    "max_model_len": ENGINE, "max_num_seqs": ENGINE, "max_batched_tokens": ENGINE, "scheduler": ENGINE,
    "watermark": ENGINE, "long_prefill_threshold": ENGINE, "preemption": ENGINE, "cpu_blocks": ENGINE,
    "vllm_version": ENGINE,
    # the KV cache's layout and the tiers below it
    "block_size": CACHE, "block_sizes": CACHE, "kv_cache_dtype": CACHE, "kv_scales": CACHE, "prefix_caching": CACHE,
    "hybrid_kv": CACHE, "cpu_kv_memory": CACHE, "disk_kv_memory": CACHE, "offload_policy": CACHE,
    "tier_eviction": CACHE, "tier_inclusion": CACHE, "layerwise_loads": CACHE,
    # replicas behind a router (simulate; sweep's axes)
    "replicas": FLEET, "router": FLEET, "routers": FLEET, "prefix_index": FLEET, "prefix_index_capacity": FLEET,
    "router_weights": FLEET, "prefill_replicas": FLEET, "decode_replicas": FLEET, "kv_link_bandwidth": FLEET,
    "kv_link_latency": FLEET, "prefill_threshold": FLEET, "shared_kv_store": FLEET, "fleet_file": FLEET,
    "log_decisions": FLEET,
    # what the command measures or searches, and how long
    "rates": RUN, "slo": RUN, "search_steps": RUN, "seeds": RUN, "workers": RUN, "ray": RUN, "max_steps": RUN,
    "repeat": RUN, "offload": RUN, "quick": RUN, "from_vidur": RUN, "source": RUN, "host_link": RUN,
    "check_invariants": RUN,
    # what it writes
    "json_path": OUTPUT, "csv_path": OUTPUT, "plot": OUTPUT, "plot_layout": OUTPUT, "gpu_out": OUTPUT, "out": OUTPUT,
    "output": OUTPUT, "note": OUTPUT,
    "config": SETTINGS, "print_config": SETTINGS,
}

# Old spellings, kept for one release: (command, old option) -> new option; "*": every command.
RENAMED: dict[tuple[str, str], str] = {
    ("*", "--format"): "--trace-format",
    ("run", "--layers"): "--num-layers",
    ("verify", "--config"): "--model-config",
}


def assign_panels(params: list[Any]) -> list[Any]:
    """Each option under its panel in ``--help`` (arguments keep Typer's own)."""
    for param in params:
        if getattr(param, "param_type_name", "") == "option" and param.name in PANELS:
            param.rich_help_panel = PANELS[param.name]
    return params


def renamed(args: list[str]) -> list[str]:
    """The command line with old spellings replaced by the new ones, each noted once on stderr."""
    command = next((arg for arg in args if not arg.startswith("-")), "")
    out = []
    for i, arg in enumerate(args):
        name, equals, value = arg.partition("=")
        new = RENAMED.get((command, name)) or RENAMED.get(("*", name))
        if new == "--model-config" and not _a_model_config(value if equals else _next(args, i)):
            new = None  # verify --config SETTINGS.yaml: the settings file every command takes
        if new is not None:
            stderr.print(f"note: {name} is deprecated; use {new} (the old spelling goes in the next release)",
                         markup=False, highlight=False, soft_wrap=True)
            arg = new + equals + value
        out.append(arg)
    return out


def _next(args: list[str], i: int) -> str:
    return args[i + 1] if i + 1 < len(args) else ""


def _a_model_config(value: str) -> bool:
    """Whether ``verify --config VALUE`` names a Qwen3 config (a preset name, or a file of Hugging Face keys) rather
    than a settings file of option names."""
    path = Path(value)
    if path.suffix.lower() not in (".yaml", ".yml", ".json") or not path.is_file():
        return True
    from minipaged_cli.cli.settings import read_settings_file

    try:
        keys = set(read_settings_file(path))
    except ValueError:
        return True
    return bool(keys & {"hidden_size", "num_attention_heads", "model_type", "head_dim", "num_hidden_layers"})
