"""``minipaged sweep``'s settings, from the command line or a ``--config`` YAML file: each one checked and
converted wherever it came from (a file gives any YAML type), so a bad one is one line naming the file (if any),
the key or option and the value, before the sweep starts; and its output paths, checked writable as early."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from minipaged_cli.errors import InputError
from minipaged_cli.fleet.config import ROUTERS
from minipaged_cli.input_files import read_mapping
from minipaged_cli.memory.strategies import STRATEGIES
from minipaged_cli.sim.settings import OFFLOAD_POLICIES, PREEMPTION_MODES, SCHEDULERS, TIER_EVICTIONS, TIER_INCLUSIONS
from minipaged_cli.units import parse_bytes
from minipaged_cli.validation import finite_number, number_from_text, positive_number, whole_number
from minipaged_cli.workloads.formats import TRACE_FORMATS
from minipaged_cli.workloads.presets import KV_CACHE_DTYPES

if TYPE_CHECKING:
    from minipaged_cli.apps.sweep import Slo

# Options a --config file may set, by their keys there: what the command line gives wins.
FILE_KEYS = ("rates", "strategies", "models", "gpus", "kv_memory", "block_sizes", "prefix_caching", "slo",
             "search_steps", "seed", "seeds", "limit", "time_scale", "trace_format", "scheduler", "max_model_len",
             "max_num_seqs", "max_batched_tokens", "watermark", "preemption", "cpu_blocks", "gpu_memory_utilization",
             "calibration", "kv_cache_dtype", "cpu_kv_memory", "offload_policy", "tier_eviction", "tier_inclusion",
             "hybrid_kv", "replicas", "routers", "concurrency", "max_concurrency")


def read_config(path: Path) -> dict[str, Any]:
    """The settings a --config file gives, by their keys (``-`` or ``_``)."""
    data = read_mapping(path, "of option names to values")
    data = {str(k).replace("-", "_"): v for k, v in data.items()}
    unknown = sorted(set(data) - set(FILE_KEYS))
    if unknown:
        raise InputError(f"unknown key; expected some of {', '.join(FILE_KEYS)}", source=str(path), field=unknown[0])
    return data


def _field_name(key: str, from_file: set[str]) -> str:
    """A setting's name in messages: its key in the --config file, or its option on the command line."""
    return key if key in from_file else "--" + key.replace("_", "-")


def checked(values: dict[str, Any], from_file: set[str], config: str) -> dict[str, Any]:
    """Every setting checked and converted, wherever it came from (a --config file gives any YAML type): a bad
    one is refused naming the file (if any), the key or option, and the value."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        where = {"field": _field_name(key, from_file), "source": config if key in from_file else None}
        out[key] = None if value is None and key in OPTIONAL_KEYS else CHECKS[key](value, where)
    if out.get("concurrency") and out.get("max_concurrency"):  # (a point's clients are closed or capped)
        raise InputError(f"sweep {_field_name('concurrency', from_file)} (closed loop) or "
                         f"{_field_name('max_concurrency', from_file)} (open loop, capped), not both",
                         field=_field_name("max_concurrency", from_file),
                         source=config if "max_concurrency" in from_file else None,
                         value=",".join(map(str, out["max_concurrency"])), has_value=True)
    # (the sweep crosses the two, leaving out exclusive tiers under write-through: each value swept needs a point)
    inclusions, policies = out.get("tier_inclusion", ()), out.get("offload_policy", ())
    if "exclusive" in inclusions and "on-eviction" not in policies:
        raise InputError("exclusive tiers get their blocks back only when the GPU evicts them: sweep them with "
                         f"{_field_name('offload_policy', from_file)} on-eviction (it is {','.join(policies)})",
                         field=_field_name("tier_inclusion", from_file),
                         source=config if "tier_inclusion" in from_file else None, value=",".join(inclusions),
                         has_value=True)
    if inclusions and "inclusive" not in inclusions and "write-through" in policies:
        raise InputError(f"write-through has no point to sweep: exclusive tiers need on-eviction (sweep "
                         f"{_field_name('tier_inclusion', from_file)} inclusive too, or leave write-through out)",
                         field=_field_name("offload_policy", from_file),
                         source=config if "offload_policy" in from_file else None, value=",".join(policies),
                         has_value=True)
    return out


def _text(value: Any, where: dict[str, Any]) -> str:
    if not isinstance(value, str | Path):
        raise InputError("must be text", value=value, has_value=True, **where)
    return str(value)


def _list(value: Any, item: Callable[[Any, dict[str, Any]], Any], where: dict[str, Any]) -> tuple[Any, ...]:
    """A comma-separated string (command line) or a list (--config), each item checked by ``item``."""
    items = [s.strip() for s in value.split(",")] if isinstance(value, str) else list(value) \
        if isinstance(value, list | tuple) else [value]
    items = [entry for entry in items if entry != ""]
    if not items:
        raise InputError("name at least one value", value=value, has_value=True, **where)
    converted = tuple(item(entry, where) for entry in items)
    if len(set(converted)) != len(converted):
        raise InputError("values must be distinct", value=value, has_value=True, **where)
    return converted


def _choice(options: tuple[str, ...]) -> Callable[[Any, dict[str, Any]], str]:
    def check(value: Any, where: dict[str, Any]) -> str:
        if value not in options:
            raise InputError(f"expected one of {', '.join(options)}", value=value, has_value=True, **where)
        return str(value)

    return check


def _strategy(item: Any, where: dict[str, Any]) -> str:
    if item not in STRATEGIES:
        raise InputError(f"unknown strategy; expected some of {', '.join(STRATEGIES)}", value=item, has_value=True,
                         **where)
    return str(item)


def _kv_memory(item: Any, where: dict[str, Any]) -> str | None:
    """A size (16GiB), or default: the GPU's memory times --gpu-memory-utilization, minus the weights."""
    return None if str(item).lower() == "default" else str(item)


def _size(item: Any, where: dict[str, Any]) -> str:
    """A tier's size (64GiB; 0: no tier), checked here so that a --config file's is refused naming the file."""
    try:
        parse_bytes(str(item), field=where["field"], allow_zero=True)
    except InputError as error:
        raise InputError(error.message, value=item, has_value=True, **where) from None
    return str(item)


def _on_off(item: Any, where: dict[str, Any]) -> bool:
    if isinstance(item, bool):
        return item
    if str(item).lower() in ("on", "true"):
        return True
    if str(item).lower() in ("off", "false"):
        return False
    raise InputError("expected on or off", value=item, has_value=True, **where)


def _slos(value: Any, where: dict[str, Any]) -> tuple[Slo, ...]:
    """--slo NAME=SECONDS (repeated), or in --config a mapping {NAME: SECONDS}."""
    from minipaged_cli.apps.sweep import make_slo, parse_slo  # the sweep's module: simulate and profile skip it

    if isinstance(value, dict):
        return tuple(make_slo(str(name), limit, source=where["source"], field=f"{where['field']}.{name}")
                     for name, limit in value.items())
    if value is not None and not isinstance(value, list | tuple):
        raise InputError("expected a mapping of SLO names to seconds", value=value, has_value=True, **where)
    return tuple(parse_slo(text) for text in value or [])


# Each setting's check: (value, where) -> the value to use.
CHECKS: dict[str, Callable[[Any, dict[str, Any]], Any]] = {
    "rates": lambda v, w: _list(v, lambda item, w: positive_number(number_from_text(item), **w), w),
    "strategies": lambda v, w: _list(v, _strategy, w),
    "models": lambda v, w: _list(v, _text, w),
    "gpus": lambda v, w: _list(v, _text, w),
    "kv_memory": lambda v, w: _list(v, _kv_memory, w),
    "block_sizes": lambda v, w: _list(v, lambda item, w: whole_number(number_from_text(item), minimum=1, **w), w),
    "prefix_caching": lambda v, w: _list(v, _on_off, w),
    "slo": _slos,
    "search_steps": lambda v, w: whole_number(v, minimum=0, **w),
    "seed": lambda v, w: whole_number(v, minimum=0, **w),
    "seeds": lambda v, w: whole_number(v, minimum=1, **w),
    "limit": lambda v, w: whole_number(v, minimum=1, **w),
    "time_scale": lambda v, w: positive_number(v, **w),
    "trace_format": _choice(TRACE_FORMATS),
    "scheduler": _choice(SCHEDULERS),
    "max_model_len": lambda v, w: whole_number(v, minimum=1, **w),
    "max_num_seqs": lambda v, w: whole_number(v, minimum=1, **w),
    "max_batched_tokens": lambda v, w: whole_number(v, minimum=1, **w),
    "watermark": lambda v, w: finite_number(v, minimum=0, maximum=1, exclusive_maximum=True, **w),
    "preemption": _choice(PREEMPTION_MODES),
    "cpu_blocks": lambda v, w: whole_number(v, minimum=0, **w),
    "gpu_memory_utilization": lambda v, w: finite_number(v, minimum=0, maximum=1, exclusive_minimum=True, **w),
    "calibration": _text,
    "kv_cache_dtype": _choice(KV_CACHE_DTYPES),
    "cpu_kv_memory": lambda v, w: _list(v, _size, w),
    "offload_policy": lambda v, w: _list(v, _choice(OFFLOAD_POLICIES), w),
    "tier_eviction": lambda v, w: _list(v, _choice(TIER_EVICTIONS), w),
    "tier_inclusion": lambda v, w: _list(v, _choice(TIER_INCLUSIONS), w),
    "hybrid_kv": _on_off,
    "replicas": lambda v, w: _list(v, lambda item, w: whole_number(number_from_text(item), minimum=1, **w), w),
    "routers": lambda v, w: _list(v, _choice(ROUTERS), w),
    "concurrency": lambda v, w: _list(v, lambda item, w: whole_number(number_from_text(item), minimum=1, **w), w),
    "max_concurrency": lambda v, w: _list(v, lambda item, w: whole_number(number_from_text(item), minimum=1, **w),
                                          w),
}
# Settings that may be left out (None): the sweep's or the engine's default applies.
OPTIONAL_KEYS = ("rates", "kv_memory", "prefix_caching", "scheduler", "limit", "max_model_len", "max_num_seqs",
                 "max_batched_tokens", "watermark", "preemption", "cpu_blocks", "calibration", "cpu_kv_memory",
                 "hybrid_kv", "gpu_memory_utilization", "concurrency", "max_concurrency")
