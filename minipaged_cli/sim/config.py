"""The simulator's configuration: one KV capacity, the engine's limits and policies, the model and GPU presets."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, TypeVar

from minipaged_cli.errors import InputError
from minipaged_cli.memory.allocators import Allocator
from minipaged_cli.memory.kv_groups import (
    KVCacheGroup,
    block_bytes,
    kv_cache_groups,
    kv_cache_size_tokens,
    max_concurrency,
)
from minipaged_cli.memory.strategies import make_allocator
from minipaged_cli.sim.clients import OPEN_LOOP, Clients
from minipaged_cli.sim.settings import CacheSettings, EngineSettings, OutputSettings, TierSettings
from minipaged_cli.sim.vllm_releases import LATEST_VLLM, vllm_release
from minipaged_cli.workloads.presets import GpuSpec, ModelSpec

if TYPE_CHECKING:  # (a calibration is loaded where one is given: cli/common.py)
    from minipaged_cli.sim.calibration import Calibration

# Defaults every command shares, written once. Those that follow vLLM are its release's (sim/vllm_releases.py):
# the newest supported release's here, for the commands that take no vllm_version.
_Settings = TypeVar("_Settings", EngineSettings, CacheSettings)

DEFAULT_BLOCK_SIZE = vllm_release(LATEST_VLLM).default_block_size
DEFAULT_GPU_MEMORY_UTILIZATION = None  # vLLM's --gpu-memory-utilization: None, the release's default
V0_WATERMARK = 0.01  # vLLM v0: BlockSpaceManager's watermark
V0_MAX_NUM_SEQS = 256
V0_BLOCK_SIZE = 16  # vLLM v0's block size (the paper's); its engine predates the release profiles


def default_prefix_caching(scheduler: str, version: str = LATEST_VLLM) -> bool:
    """Prefix caching where it is not set: ``vllm serve``'s default in v1 (on), off in v0."""
    return scheduler == "v1" and vllm_release(version).enable_prefix_caching


def resolve_block_size(block_size: int | None, model: ModelSpec, gpu: GpuSpec, scheduler: str,
                       version: str = LATEST_VLLM) -> int:
    """The block size asked for, else the release's for the model and GPU (``VllmRelease.block_size``); v0's
    16 under v0."""
    if block_size is not None:
        return block_size
    return vllm_release(version).block_size(model, gpu) if scheduler == "v1" else V0_BLOCK_SIZE


def resolve_hybrid_kv(hybrid_kv: bool | None, scheduler: str) -> bool:
    """Whether the hybrid KV cache manager runs: as asked, else vLLM v1's default (on); v0 had none."""
    return scheduler == "v1" if hybrid_kv is None else hybrid_kv


def vllm_serve_batch_defaults(gpu: GpuSpec, version: str = LATEST_VLLM) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) as ``vllm serve`` sets them when not given
    (``VllmRelease.batch_defaults``)."""
    return vllm_release(version).batch_defaults(gpu)


def _resolved(settings: _Settings, defaults: dict[str, object]) -> _Settings:
    """``settings`` with each of ``defaults`` that it leaves None filled in."""
    filled = {name: value for name, value in defaults.items() if getattr(settings, name) is None}
    return replace(settings, **filled) if filled else settings


# SimConfig's concerns, by its field's name.
CONCERNS: dict[str, type] = {"engine": EngineSettings, "cache": CacheSettings, "tiers": TierSettings,
                             "outputs": OutputSettings}


def _by_concern(settings: dict[str, object]) -> dict[str, dict[str, object]]:
    """The settings named in ``settings`` that belong to a concern, taken out of it, by concern."""
    by_concern: dict[str, dict[str, object]] = {}
    for concern, kind in CONCERNS.items():
        for name in [f.name for f in fields(kind) if f.name in settings]:
            by_concern.setdefault(concern, {})[name] = settings.pop(name)
    return by_concern


@dataclass(frozen=True)
class SimConfig:
    """One capacity for every strategy: ``cache.num_blocks * cache.block_size`` KV slots of
    ``model.kv_bytes_per_token``; the composition of the settings by concern (``sim/settings.py``) with the model,
    the GPU and the clients.

    The model's concern is here: ``max_model_len`` (None: the model's) and ``calibration`` (measured step times;
    None: the GPU preset's efficiency model). A setting left None takes the engine's release's default, resolved
    at construction (``EngineSettings`` has the table); the rules that span two concerns are checked here.
    """

    model: ModelSpec
    gpu: GpuSpec
    cache: CacheSettings
    engine: EngineSettings = field(default_factory=EngineSettings)
    tiers: TierSettings = field(default_factory=TierSettings)
    outputs: OutputSettings = field(default_factory=OutputSettings)
    max_model_len: int | None = None
    calibration: Calibration | None = None
    clients: Clients = OPEN_LOOP  # when requests are sent: open loop, closed loop, capped (sim/clients.py)

    def __post_init__(self) -> None:
        engine, cache, release = self.engine, self.cache, vllm_release(self.engine.vllm_version)
        batched_tokens, num_seqs = release.batch_defaults(self.gpu) if engine.v1 else (None, V0_MAX_NUM_SEQS)
        engine_defaults = {"max_num_seqs": num_seqs, "max_batched_tokens": batched_tokens,
                           "watermark": release.watermark if engine.v1 else V0_WATERMARK,
                           "cache_aware_admission_window": release.cache_aware_admission_window or 0,
                           "cache_aware_admission_threshold": release.cache_aware_admission_threshold or 0.0}
        cache_defaults = {"block_size": resolve_block_size(None, self.model, self.gpu, engine.scheduler,
                                                           release.version),
                          "prefix_caching": default_prefix_caching(engine.scheduler, release.version),
                          "hybrid_kv": resolve_hybrid_kv(None, engine.scheduler)}
        # frozen: resolved once, here
        object.__setattr__(self, "engine", _resolved(engine, engine_defaults))
        object.__setattr__(self, "cache", _resolved(cache, cache_defaults))
        if self.max_model_len is not None and self.max_model_len < 1:
            raise InputError("must be >= 1", field="{max_model_len}", value=self.max_model_len, has_value=True)
        if self.calibration is not None:
            self.calibration.check_gpu(self.gpu.name)
        if self.cache.hybrid_kv and self.model.is_hybrid and not self.engine.v1:
            raise InputError("the hybrid KV cache manager is vLLM v1's (v0 kept every layer's tokens); pass "
                             "{hybrid_kv=False} with {scheduler=v0}", field="{hybrid_kv}", value=self.model.name,
                             has_value=True)
        self._check_tiers()
        if self.engine.preemption == "swap" and not self.swap_blocks:
            raise InputError("swap needs a CPU pool; set {cpu_blocks} or {cpu_kv_memory}", field="{cpu_blocks}",
                             value=0, has_value=True)

    @classmethod
    def of(cls, model: ModelSpec, gpu: GpuSpec, num_blocks: int, **settings: object) -> SimConfig:
        """The short form for scripts and tests: each setting, by its name, goes to its concern
        (``SimConfig.of(model, gpu, 64, scheduler="v0")`` is
        ``SimConfig(model, gpu, CacheSettings(64), EngineSettings(scheduler="v0"))``)."""
        by_concern = _by_concern(settings)
        return cls(model, gpu, CacheSettings(num_blocks, **by_concern.pop("cache", {})),
                   **{name: CONCERNS[name](**mine) for name, mine in by_concern.items()}, **settings)

    def with_settings(self, **settings: object) -> SimConfig:
        """This configuration with the named settings changed, each in its concern (as ``of``). A default it
        resolved stays as resolved: changing ``scheduler`` here keeps the other engine's limits."""
        changes = {name: replace(getattr(self, name), **mine) for name, mine in _by_concern(settings).items()}
        return replace(self, **changes, **settings)

    def _check_tiers(self) -> None:
        """The tiers' rules that depend on the engine and the cache."""
        tiers, engine = self.tiers, self.engine
        if not tiers.has_tiers:
            return
        if engine.v1 and not self.cache.prefix_caching:
            raise InputError("the host tier holds prefix-cache blocks: it needs {prefix_caching=True}",
                             field="{cpu_kv_memory}")
        if engine.v1:
            return
        # v0: the host tier is the swap space, and the prefix cache's tier when prefix caching is on
        if not self.cache.prefix_caching and engine.preemption != "swap":
            # (no option named for prefix caching: `run` has none, its v0 never caches)
            raise InputError(f"under {{scheduler=v0}} the host tier is the swap space ({{preemption=swap}}) or "
                             f"holds prefix-cache blocks (prefix caching on); with {{preemption={engine.preemption}}} "
                             f"and prefix caching off it would hold nothing", field="{cpu_kv_blocks}",
                             value=tiers.cpu_kv_blocks, has_value=True)
        if self.cache.cpu_blocks and self.cache.cpu_blocks != tiers.cpu_kv_blocks:
            raise InputError(f"under {{scheduler=v0}} the host tier is the swap space, and {{cpu_kv_memory}} holds "
                             f"{tiers.cpu_kv_blocks} blocks; give one of the two (or the same number)",
                             field="{cpu_blocks}", value=self.cache.cpu_blocks, has_value=True)
        if tiers.disk_kv_blocks:
            raise InputError("a disk tier under {scheduler=v0} is not modelled (v0 swaps into the host tier only); "
                             "use {scheduler=v1}", field="{disk_kv_blocks}", value=tiers.disk_kv_blocks,
                             has_value=True)
        if tiers.layerwise_loads:
            raise InputError("under {scheduler=v0} a load from the host tier ends before the step's forward, not "
                             "layer by layer; use {scheduler=v1}", field="{layerwise_loads}", value=True,
                             has_value=True)

    @property
    def swap_blocks(self) -> int:
        """v0's swap space in blocks: the host tier when there is one (it holds the swapped-out blocks), else
        ``cache.cpu_blocks``."""
        if self.tiers.has_tiers and not self.engine.v1:
            return self.tiers.cpu_kv_blocks
        return self.cache.cpu_blocks

    def without_tiers(self) -> SimConfig:
        """The same engine with nothing below the GPU's prefix cache (what the tiers buy is the difference); v0
        keeps its swap space, swapping without the host tier's link clock."""
        return replace(self, tiers=replace(self.tiers, cpu_kv_blocks=0, disk_kv_blocks=0),
                       cache=replace(self.cache, cpu_blocks=self.swap_blocks))

    @property
    def kv_cache_groups(self) -> tuple[KVCacheGroup, ...]:
        return kv_cache_groups(self.model, hybrid=bool(self.cache.hybrid_kv))

    @property
    def block_size(self) -> int:
        """The resolved block size (``cache.block_size`` is never None here)."""
        assert self.cache.block_size is not None, "resolved at construction"
        return self.cache.block_size

    @property
    def watermark_blocks(self) -> int:
        assert self.engine.watermark is not None, "resolved at construction"
        return int(self.engine.watermark * self.cache.num_blocks)

    @property
    def kv_capacity_tokens(self) -> int:
        """Slots: a token's K/V in one KV cache group (in every layer, for a model without sliding windows)."""
        return self.cache.kv_capacity_tokens

    @property
    def kv_memory_bytes(self) -> int:
        return self.cache.num_blocks * block_bytes(self.model, self.kv_cache_groups, self.block_size)

    @property
    def kv_size_tokens(self) -> int:
        """vLLM's "KV cache size: N tokens" for this pool (``kv_groups.kv_cache_size_tokens``)."""
        return kv_cache_size_tokens(self.kv_cache_groups, self.cache.num_blocks, self.block_size,
                                    self.model_len, self.engine.max_batched_tokens or self.model_len)

    @property
    def max_concurrency(self) -> float:
        """vLLM's "Maximum concurrency for max_model_len tokens per request" for this pool."""
        return max_concurrency(self.kv_cache_groups, self.cache.num_blocks, self.block_size, self.model_len,
                               self.engine.max_batched_tokens or self.model_len)

    def all_full_attention(self) -> SimConfig:
        """The same KV memory with every layer treated as full attention (vLLM's
        disable-hybrid-kv-cache-manager): fewer, larger blocks."""
        def all_layers(blocks: int) -> int:  # the same bytes in blocks of every layer
            page = block_bytes(self.model, self.kv_cache_groups, self.block_size)
            return num_blocks_for_memory(blocks * page, self.model, self.block_size, hybrid=False)

        return replace(self, cache=replace(self.cache, hybrid_kv=False, num_blocks=all_layers(self.cache.num_blocks)),
                       tiers=replace(self.tiers, cpu_kv_blocks=all_layers(self.tiers.cpu_kv_blocks),
                                     disk_kv_blocks=all_layers(self.tiers.disk_kv_blocks)))

    @property
    def model_len(self) -> int:
        return self.max_model_len or self.model.max_model_len

    @property
    def prefill_token_limit(self) -> int:
        """``EngineSettings.prefill_token_limit`` for this model length."""
        return self.engine.prefill_token_limit(self.model_len)

    def allocator(self, strategy: str) -> Allocator:
        """A fresh allocator of ``strategy`` on this capacity."""
        return make_allocator(strategy, num_blocks=self.cache.num_blocks, block_size=self.block_size,
                              max_model_len=self.model_len, prefix_caching=bool(self.cache.prefix_caching),
                              groups=self.kv_cache_groups, max_batched_tokens=self.engine.max_batched_tokens)


def num_blocks_for_memory(kv_memory_bytes: int, model: ModelSpec, block_size: int, *, hybrid: bool = True) -> int:
    """Blocks of ``block_size`` tokens that fit in ``kv_memory_bytes`` of KV for ``model``: vLLM's
    available memory // the bytes of one block (``kv_groups.block_bytes``: every layer's page for a uniform
    model or without the hybrid manager, one group's pages with it)."""
    return math.floor(kv_memory_bytes / block_bytes(model, kv_cache_groups(model, hybrid=hybrid), block_size))
