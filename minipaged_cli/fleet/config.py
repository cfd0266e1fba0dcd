"""A fleet's configuration: pools of replicas (each with its own ``SimConfig``), the router, the P/D link, the
shared KV store. Small frozen dataclasses, checked at construction (``InputError``: exit 2 on the command line)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from minipaged_cli.errors import InputError, did_you_mean
from minipaged_cli.fleet.names import (
    DEFAULT_INDEX_CAPACITY,
    DEFAULT_WEIGHTS,
    PREFIX_INDEXES,
    ROLES,
    ROUTERS,
    WEIGHT_NAMES,
)
from minipaged_cli.sim.clients import Clients
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.units import parse_bytes
from minipaged_cli.validation import finite_number, positive_number, whole_number


@dataclass(frozen=True)
class RouterConfig:
    """Which replica takes a request: ``name`` (``ROUTERS``); ``prefix_index``: what a prefix score reads, the
    replicas' published KV events (``precise``) or the router's own LRU index of what it sent where
    (``approximate``, ``index_capacity`` blocks); ``weights`` of the ``weighted`` scorer (``session``: llm-d's
    session-affinity scorer, 1 for the replica that answered the session's last turn, 0 for the others)."""

    name: str = "round-robin"
    prefix_index: str = "precise"
    index_capacity: int = DEFAULT_INDEX_CAPACITY
    weights: tuple[tuple[str, float], ...] = DEFAULT_WEIGHTS
    source: str | None = None  # the fleet file it came from, for errors

    def __post_init__(self) -> None:
        if self.name not in ROUTERS:
            raise InputError(f"unknown router{did_you_mean(self.name, ROUTERS)}; expected one of {', '.join(ROUTERS)}",
                             source=self.source, field="router", value=self.name, has_value=True)
        if self.prefix_index not in PREFIX_INDEXES:
            raise InputError(f"expected one of {', '.join(PREFIX_INDEXES)}", source=self.source,
                             field="prefix_index", value=self.prefix_index, has_value=True)
        whole_number(self.index_capacity, field="index_capacity", source=self.source, minimum=1)
        for name, weight in self.weights:
            if name not in WEIGHT_NAMES:
                raise InputError(f"unknown scorer{did_you_mean(name, WEIGHT_NAMES)}; expected some of "
                                 f"{', '.join(WEIGHT_NAMES)}", source=self.source, field="weights", value=name,
                                 has_value=True)
            finite_number(weight, field=f"weights.{name}", source=self.source, minimum=0.0)

    @property
    def reads_prefixes(self) -> bool:
        return self.name == "prefix-aware" or (self.name == "weighted" and dict(self.weights).get("prefix", 0) > 0)

    @property
    def reads_replicas(self) -> bool:
        """Whether a choice reads what the replicas published: load, KV usage or prefixes (every router but
        round-robin; session affinity breaks its ties by load)."""
        return self.name != "round-robin"

    @property
    def reads_sessions(self) -> bool:
        return self.name == "session-affinity" or (self.name == "weighted"
                                                   and dict(self.weights).get("session", 0) > 0)

    def to_dict(self) -> dict[str, object]:
        document: dict[str, object] = {"name": self.name}
        if self.reads_prefixes:
            document["prefix_index"] = self.prefix_index
            if self.prefix_index == "approximate":
                document["index_capacity"] = self.index_capacity
        if self.name == "weighted":
            document["weights"] = dict(self.weights)
        return document


def parse_weights(text: str, *, field: str = "{router_weights}", source: str | None = None
                  ) -> tuple[tuple[str, float], ...]:
    """``"prefix:2,queue:1,kv:1"`` -> (("prefix", 2.0), ("queue", 1.0), ("kv", 1.0))."""
    weights = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        name, sep, value = part.partition(":")
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not sep or not math.isfinite(number):
            raise InputError("expected name:number pairs such as prefix:2,queue:1,kv:1", source=source, field=field,
                             value=part, has_value=True)
        weights.append((name.strip(), number))
    if not weights:
        raise InputError("name at least one scorer", source=source, field=field, value=text, has_value=True)
    return tuple(weights)


@dataclass(frozen=True)
class KvLink:
    """The link a finished prefill's KV crosses to its decode replica: ``bandwidth_bytes_per_s`` and a fixed
    ``latency_s`` per transfer; one queue (a transfer waits while the link is busy)."""

    bandwidth_bytes_per_s: float
    latency_s: float = 0.0
    source: str | None = None

    def __post_init__(self) -> None:
        positive_number(self.bandwidth_bytes_per_s, field="kv_link.bandwidth", source=self.source)
        finite_number(self.latency_s, field="kv_link.latency", source=self.source, minimum=0.0)


@dataclass(frozen=True)
class ReplicaPool:
    """``num_replicas`` identical replicas of one engine ``config``, in one ``role`` (``ROLES``)."""

    name: str
    num_replicas: int
    config: SimConfig
    role: str = "mixed"
    source: str | None = None

    def __post_init__(self) -> None:
        whole_number(self.num_replicas, field=f"pools.{self.name}.replicas", source=self.source, minimum=1)
        if self.role not in ROLES:
            raise InputError(f"expected one of {', '.join(ROLES)}", source=self.source,
                             field=f"pools.{self.name}.role", value=self.role, has_value=True)
        if self.role == "decode" and self.config.kv_capacity_tokens < self.config.model_len:
            raise InputError(f"the decode pool's KV memory ({self.config.kv_capacity_tokens} tokens) cannot hold one "
                             f"max-length request ({self.config.model_len} tokens); raise its kv_memory",
                             source=self.source, field=f"pools.{self.name}.kv_memory",
                             value=self.config.kv_capacity_tokens, has_value=True)


@dataclass(frozen=True)
class FleetConfig:
    """Pools of replicas behind one router. P/D disaggregation: a ``prefill`` pool and a ``decode`` pool (no mixed
    one) and the ``kv_link`` between them; prompts of at most ``prefill_threshold`` tokens prefill on their decode
    replica (BLIS's prefix-threshold decider). ``shared_kv_store``: the tiers below the GPUs are one store shared
    by every replica (``fleet/shared_store.py``). The pools' engine configs name the clients (``sim/clients.py``:
    open loop, closed loop, capped): one set for the whole fleet, so every pool names the same."""

    pools: tuple[ReplicaPool, ...]
    router: RouterConfig = field(default_factory=RouterConfig)
    kv_link: KvLink | None = None
    prefill_threshold: int = 0
    shared_kv_store: bool = False
    log_decisions: bool = False
    record_timeline: bool = False
    source: str | None = None

    def __post_init__(self) -> None:
        roles = [pool.role for pool in self.pools]
        if not self.pools:
            raise InputError("a fleet needs at least one pool of replicas", source=self.source, field="pools")
        disaggregated = "prefill" in roles or "decode" in roles
        if disaggregated and (roles.count("prefill") != 1 or roles.count("decode") != 1 or "mixed" in roles):
            raise InputError("P/D disaggregation takes one prefill pool and one decode pool, and no mixed pool",
                             source=self.source, field="pools", value=",".join(roles), has_value=True)
        if disaggregated and self.kv_link is None:
            raise InputError("a prefill and a decode pool need a KV link between them (bandwidth, latency)",
                             source=self.source, field="kv_link")
        if disaggregated and any(pool.config.engine.scheduler != "v1" or pool.config.tiers.has_tiers
                                 for pool in self.pools):
            raise InputError("P/D disaggregation runs vLLM v1's scheduler without tiers below the GPU",
                             source=self.source, field="pools")
        whole_number(self.prefill_threshold, field="prefill_threshold", source=self.source, minimum=0)
        if len({pool.config.clients for pool in self.pools}) > 1:
            raise InputError("the fleet's clients send to every pool: give its pools the same clients",
                             source=self.source, field="pools")
        if self.shared_kv_store and not all(pool.config.tiers.has_tiers for pool in self.pools):
            raise InputError("a shared KV store is the tiers below the GPU: give {cpu_kv_memory}",
                             source=self.source, field="shared_kv_store")

    @property
    def clients(self) -> Clients:
        """Who sends the requests, and when, fleet-wide."""
        return self.pools[0].config.clients

    @property
    def disaggregated(self) -> bool:
        return any(pool.role == "prefill" for pool in self.pools)

    @property
    def num_replicas(self) -> int:
        return sum(pool.num_replicas for pool in self.pools)


_DURATIONS = {"s": 1.0, "ms": 1e3, "us": 1e6, "µs": 1e6, "ns": 1e9}  # units per second


def parse_bandwidth(text: str, *, field: str = "{kv_link_bandwidth}", source: str | None = None) -> float:
    """``"50GB/s"`` -> 5e10 bytes per second (a size as ``--kv-memory`` takes it, per second); refused unless
    finite and positive."""
    size = str(text).strip()
    size = size[:-2] if size.lower().endswith("/s") else size
    try:
        value = float(parse_bytes(size, field=field, allow_zero=True))
    except InputError:
        raise InputError("expected a bandwidth such as 50GB/s or 400GB/s", source=source, field=field, value=text,
                         has_value=True) from None
    if not value > 0:
        raise InputError("must be > 0", source=source, field=field, value=text, has_value=True)
    return value


def parse_duration(text: str, *, field: str = "{kv_link_latency}", source: str | None = None) -> float:
    """``"20us"`` -> 2e-05 seconds (s, ms, us, ns; a bare number is seconds)."""
    written = str(text).strip()
    unit = next((u for u in sorted(_DURATIONS, key=len, reverse=True) if written.endswith(u)), "")
    try:
        value = float(written[:len(written) - len(unit)]) / _DURATIONS.get(unit, 1.0)
    except ValueError:
        raise InputError("expected a duration such as 20us, 1.5ms or 0", source=source, field=field, value=text,
                         has_value=True) from None
    return finite_number(value, field=field, source=source, minimum=0.0)
