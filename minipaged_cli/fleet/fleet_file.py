"""``--fleet FLEET.yaml``: pools of replicas with their own model, GPU and KV memory, the router and its weights,
the P/D link, the shared store (examples under ``configs/fleets/``). Whatever a pool does not set it takes from
the command line's engine; every bad value is refused with one line naming the file, the field and the value.

```yaml
router: {name: weighted, prefix_index: precise, weights: {prefix: 2, queue: 1, kv: 1}}
pools:
  - {name: prefill, role: prefill, replicas: 2, kv_memory: 16GiB}
  - {name: decode, role: decode, replicas: 1, model: qwen3-8b, gpu: h200, kv_memory: 40GiB}
kv_link: {bandwidth: 50GB/s, latency: 20us}
prefill_threshold: 256     # prompts up to this many tokens prefill on their decode replica
shared_kv_store: false
```
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

from minipaged_cli.errors import InputError
from minipaged_cli.fleet.config import (
    DEFAULT_INDEX_CAPACITY,
    FleetConfig,
    KvLink,
    ReplicaPool,
    RouterConfig,
    parse_bandwidth,
    parse_duration,
)
from minipaged_cli.input_files import read_mapping
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.kv_sizing import resolve_num_blocks
from minipaged_cli.workloads.presets import load_gpu, load_model

_TOP = ("version", "router", "pools", "kv_link", "prefill_threshold", "shared_kv_store")
_POOL = ("name", "role", "replicas", "model", "gpu", "kv_memory", "num_blocks")


def load_fleet_file(path: Path, base: SimConfig, **options: Any) -> FleetConfig:
    """The fleet ``path`` describes, its pools' engines ``base`` with what each pool sets; ``options``: the
    command line's ``log_decisions`` and ``record_timeline``."""
    source = str(path)
    document = read_mapping(path, "with 'pools'")  # (a repeated key is refused with its line)
    _known(document, _TOP, source, "")
    router = document.get("router") or {}
    if isinstance(router, str):
        router = {"name": router}
    _mapping(router, source, "router")
    weights = router.get("weights")
    if weights is not None:
        _mapping(weights, source, "router.weights")
        for name, weight in weights.items():
            if isinstance(weight, bool) or not isinstance(weight, int | float):
                raise InputError("must be a number", source=source, field=f"router.weights.{name}", value=weight,
                                 has_value=True)
    router_config = RouterConfig(
        name=router.get("name", "round-robin"), prefix_index=router.get("prefix_index", "precise"),
        index_capacity=router.get("index_capacity", DEFAULT_INDEX_CAPACITY),
        **({"weights": tuple((str(k), float(v)) for k, v in weights.items())} if weights else {}), source=source)
    pools = document.get("pools")
    if not isinstance(pools, list) or not pools:
        raise InputError("expected a list of pools", source=source, field="pools", value=pools, has_value=True)
    link = document.get("kv_link")
    kv_link = None
    if link is not None:
        _mapping(link, source, "kv_link")
        kv_link = KvLink(parse_bandwidth(link.get("bandwidth"), field="kv_link.bandwidth", source=source),
                         parse_duration(link.get("latency", 0), field="kv_link.latency", source=source), source)
    return FleetConfig(tuple(_pool(p, i, base, source) for i, p in enumerate(pools)), router_config, kv_link,
                       document.get("prefill_threshold", 0), bool(document.get("shared_kv_store", False)),
                       source=source, **options)


def _pool(pool: Any, index: int, base: SimConfig, source: str) -> ReplicaPool:
    _mapping(pool, source, f"pools[{index}]")
    _known(pool, _POOL, source, f"pools[{index}].")
    name = str(pool.get("name", f"pool{index}"))
    model = load_model(pool["model"]) if "model" in pool else base.model
    gpu = load_gpu(pool["gpu"]) if "gpu" in pool else base.gpu
    config = base
    if {"model", "gpu", "kv_memory", "num_blocks"} & pool.keys():
        try:
            num_blocks, _, _ = resolve_num_blocks(model, gpu, base.block_size, pool.get("num_blocks"),
                                                  pool.get("kv_memory"), None, hybrid=bool(base.cache.hybrid_kv),
                                                  vllm_version=base.engine.vllm_version,
                                                  max_num_batched_tokens=base.engine.max_batched_tokens,
                                                  max_num_seqs=base.engine.max_num_seqs)
        except InputError as error:
            raise InputError(error.message, source=source, field=f"pools.{name}.kv_memory",
                             value=pool.get("kv_memory", pool.get("num_blocks")), has_value=True) from None
        config = replace(base, model=model, gpu=gpu, cache=replace(base.cache, num_blocks=num_blocks))
    return ReplicaPool(name, pool.get("replicas", 1), config, pool.get("role", "mixed"), source)


def _mapping(value: Any, source: str, field: str) -> None:
    if not isinstance(value, dict):
        raise InputError("expected a mapping", source=source, field=field, value=value, has_value=True)


def _known(mapping: dict[str, Any], fields: tuple[str, ...], source: str, prefix: str) -> None:
    for key in mapping:
        if key not in fields:
            raise InputError(f"unknown field; expected some of {', '.join(fields)}", source=source,
                             field=f"{prefix}{key}")
