"""The simulator's configuration: one KV capacity, the engine's limits and policies, the model and GPU presets."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from minipaged_cli.errors import InputError, did_you_mean
from minipaged_cli.memory.allocators import Allocator
from minipaged_cli.memory.kv_groups import (
    KVCacheGroup,
    block_bytes,
    kv_cache_groups,
    kv_cache_size_tokens,
    max_concurrency,
)
from minipaged_cli.memory.strategies import make_allocator
from minipaged_cli.sim.calibration import Calibration
from minipaged_cli.sim.clients import OPEN_LOOP, Clients
from minipaged_cli.sim.vllm_releases import LATEST_VLLM, VllmRelease, vllm_release
from minipaged_cli.validation import whole_number
from minipaged_cli.workloads.presets import GpuSpec, ModelSpec

PREEMPTION_MODES = ("recompute", "swap")
SCHEDULERS = ("v1", "v0")  # vLLM's v1 engine (the default), and its removed v0 engine (the paper's)

# Defaults every command shares, written once. Those that follow vLLM are its release's (sim/vllm_releases.py):
# the newest supported release's here, for the commands that take no --vllm-version.
DEFAULT_BLOCK_SIZE = vllm_release(LATEST_VLLM).default_block_size
DEFAULT_GPU_MEMORY_UTILIZATION = None  # vLLM's --gpu-memory-utilization: None, the release's default
V0_WATERMARK = 0.01  # vLLM v0: BlockSpaceManager's watermark
V0_MAX_NUM_SEQS = 256
V0_BLOCK_SIZE = 16  # vLLM v0's block size (the paper's); its engine predates the release profiles
# The prefix cache's tiers below the GPU (sim/tiers.py): when a block goes down, and how a tier evicts.
OFFLOAD_POLICIES = ("write-through", "on-eviction")
TIER_EVICTIONS = ("lru", "arc")
# Whether a block a tier delivers to the GPU stays in that tier (a copy) or leaves it (a move)
TIER_INCLUSIONS = ("inclusive", "exclusive")


def default_prefix_caching(scheduler: str, version: str = LATEST_VLLM) -> bool:
    """Prefix caching where it is not set: ``vllm serve``'s default in v1 (on), off in v0."""
    return scheduler == "v1" and vllm_release(version).enable_prefix_caching


def resolve_block_size(block_size: int | None, model: ModelSpec, gpu: GpuSpec, scheduler: str,
                       version: str = LATEST_VLLM) -> int:
    """The block size asked for, else the release's for the model and GPU (``VllmRelease.block_size``); v0's
    16 under ``--scheduler v0``."""
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


@dataclass(frozen=True)
class SimConfig:
    """One capacity for every strategy: ``num_blocks * block_size`` KV slots of ``model.kv_bytes_per_token``.

    ``scheduler`` picks the engine whose policy the replay follows (``sim/scheduler.py``): ``v1`` (vLLM's
    engine today) or ``v0``. A limit left None takes that engine's default, resolved at construction:

    | field              | v1 (``vllm serve``)                          | v0                 |
    |--------------------|----------------------------------------------|--------------------|
    | max_num_seqs       | ``vllm_serve_batch_defaults``: 1024 or 256   | 256                |
    | max_batched_tokens | ``vllm_serve_batch_defaults``: 8192 or 2048  | None: whole prompts|
    | prefix_caching     | True                                         | False              |
    | watermark          | 0.0                                          | 0.01               |
    | block_size         | ``VllmRelease.block_size``: 64 (0.34), 16    | 16                 |
    | cache-aware window | 0: off (0.34.0's option; 0.33 has none)      | -                  |

    ``vllm_version`` picks the release whose defaults apply (``sim/vllm_releases.py``).

    Tiers below the GPU's prefix cache (``sim/tiers.py``; paged with prefix caching; under v0 the host tier
    alone, which is also the swap space, ``swap_blocks``):
    ``cpu_kv_blocks`` of host memory and ``disk_kv_blocks`` of local disk under it, in the pool's blocks
    (``block_size`` tokens; one KV cache group's layers under the hybrid manager); ``offload_policy`` says when a
    block goes down (``write-through``: every computed full block, as vLLM's OffloadingConnector and LMCache store;
    ``on-eviction``: when the tier above evicts it), ``tier_eviction`` how each tier evicts (``lru``, or ``arc`` as
    vLLM's ARC policy), ``tier_inclusion`` whether a block the GPU caches stays in the tiers below (``inclusive``,
    as vLLM's connector, LMCache and SGLang HiCache keep it) or leaves them (``exclusive``: one copy of a block in
    the whole hierarchy; needs ``on-eviction``), ``layerwise_loads`` whether a load overlaps the request's prefill
    layer by layer (LMCache's layerwise mode) instead of finishing first (vLLM's connector).
    """

    model: ModelSpec
    gpu: GpuSpec
    num_blocks: int
    block_size: int | None = None  # None: the release's (resolve_block_size)
    max_model_len: int | None = None  # None: the model's
    max_num_seqs: int | None = None
    max_batched_tokens: int | None = None  # v0: None prefills whole prompts (no chunking)
    prefix_caching: bool | None = None  # paged only
    preemption: str = "recompute"  # or "swap" (v0 only)
    cpu_blocks: int = 0  # swap space, in blocks of block_size tokens
    watermark: float | None = None  # paged admission keeps this fraction of the blocks free
    scheduler: str = "v1"
    # vLLM v1's hybrid KV cache manager: a group per attention type, sliding windows free what they no longer see
    # (``memory/kv_groups.py``); False treats every layer as full attention (--disable-hybrid-kv-cache-manager).
    hybrid_kv: bool | None = None  # None: on under v1 (``resolve_hybrid_kv``)
    long_prefill_token_threshold: int = 0  # v1: most prompt tokens one request prefills a step; 0: no limit
    calibration: Calibration | None = None  # measured step times; None: the GPU preset's efficiency model
    check_invariants: bool = False
    record_timeline: bool = False
    record_layout: bool = False  # samples of which sequence owns each slot (sim/layout.py)
    cpu_kv_blocks: int = 0  # host-memory tier of the prefix cache
    disk_kv_blocks: int = 0  # local-disk tier under it
    offload_policy: str = "write-through"
    tier_eviction: str = "lru"
    tier_inclusion: str = "inclusive"
    layerwise_loads: bool = False
    vllm_version: str = LATEST_VLLM  # the release whose defaults fill what is None (sim/vllm_releases.py)
    # v1, vLLM 0.34.0's cache-aware admission: while the KV cache's usage is at least the threshold, the first
    # `window` waiting requests are admitted deepest cached prefix first (0: arrival order). None: the release's.
    cache_aware_admission_window: int | None = None
    cache_aware_admission_threshold: float | None = None
    clients: Clients = OPEN_LOOP  # when requests are sent: open loop, closed loop, capped (sim/clients.py)

    def __post_init__(self) -> None:
        if self.scheduler not in SCHEDULERS:
            raise InputError(f"expected one of {', '.join(SCHEDULERS)}", field="--scheduler", value=self.scheduler,
                             has_value=True)
        v1 = self.scheduler == "v1"
        release = vllm_release(self.vllm_version)
        object.__setattr__(self, "vllm_version", release.version)  # frozen: "0.34.0" is "0.34"
        batched_tokens, num_seqs = release.batch_defaults(self.gpu) if v1 else (None, V0_MAX_NUM_SEQS)
        defaults = {"max_num_seqs": num_seqs, "max_batched_tokens": batched_tokens,
                    "prefix_caching": default_prefix_caching(self.scheduler, release.version),
                    "watermark": release.watermark if v1 else V0_WATERMARK,
                    "block_size": resolve_block_size(None, self.model, self.gpu, self.scheduler, release.version),
                    "cache_aware_admission_window": release.cache_aware_admission_window or 0,
                    "cache_aware_admission_threshold": release.cache_aware_admission_threshold or 0.0}
        defaults["hybrid_kv"] = resolve_hybrid_kv(None, self.scheduler)
        for name, default in defaults.items():
            if getattr(self, name) is None:
                object.__setattr__(self, name, default)  # frozen: resolved once, here
        positive = {"--num-blocks": self.num_blocks, "--block-size": self.block_size,
                    "--max-num-seqs": self.max_num_seqs, "--max-model-len": self.max_model_len or 1,
                    "--max-batched-tokens": self.max_batched_tokens or 1}
        for option, value in positive.items():
            if value < 1:
                raise InputError("must be >= 1", field=option, value=value, has_value=True)
        if self.preemption not in PREEMPTION_MODES:
            raise InputError(f"expected one of {', '.join(PREEMPTION_MODES)}", field="--preemption",
                             value=self.preemption, has_value=True)
        if self.cpu_blocks < 0:
            raise InputError("must be >= 0", field="--cpu-blocks", value=self.cpu_blocks, has_value=True)
        if self.preemption == "swap" and v1:
            raise InputError("vLLM v1 preempts by recompute only; swap is the v0 engine's (--scheduler v0)",
                             field="--preemption", value=self.preemption, has_value=True)
        if self.long_prefill_token_threshold < 0:
            raise InputError("must be >= 0", field="--long-prefill-threshold",
                             value=self.long_prefill_token_threshold, has_value=True)
        if not 0.0 <= self.watermark < 1.0:
            raise InputError("must be in [0, 1)", field="--watermark", value=self.watermark, has_value=True)
        if self.calibration is not None:
            self.calibration.check_gpu(self.gpu.name)
        self._check_cache_aware_admission(release)
        if self.hybrid_kv and self.model.is_hybrid and not v1:
            raise InputError("the hybrid KV cache manager is vLLM v1's (v0 kept every layer's tokens); pass "
                             "--no-hybrid-kv with --scheduler v0", field="--hybrid-kv", value=self.model.name,
                             has_value=True)
        self._check_tiers()
        if self.preemption == "swap" and not self.swap_blocks:
            raise InputError("swap needs a CPU pool; set --cpu-blocks or --cpu-kv-memory", field="--cpu-blocks",
                             value=0, has_value=True)

    def _check_cache_aware_admission(self, release: VllmRelease) -> None:
        window = whole_number(self.cache_aware_admission_window, field="--cache-aware-admission-window", minimum=0)
        if window and release.cache_aware_admission_window is None:
            raise InputError(f"cache-aware admission is vLLM 0.34.0's; vLLM {release.wheel} admits in arrival "
                             "order (--vllm-version 0.34)", field="--cache-aware-admission-window", value=window,
                             has_value=True)
        if window and self.scheduler != "v1":
            raise InputError("cache-aware admission is a v1 scheduler option (--scheduler v1)",
                             field="--cache-aware-admission-window", value=window, has_value=True)
        threshold = self.cache_aware_admission_threshold
        if threshold is None or not 0.0 <= threshold <= 1.0:
            raise InputError("must be in [0, 1]", field="--cache-aware-admission-threshold", value=threshold,
                             has_value=True)

    def _check_tiers(self) -> None:
        whole_number(self.cpu_kv_blocks, field="--cpu-kv-memory (blocks)", minimum=0)
        whole_number(self.disk_kv_blocks, field="--disk-kv-memory (blocks)", minimum=0)
        for option, value, names in (("--offload-policy", self.offload_policy, OFFLOAD_POLICIES),
                                     ("--tier-eviction", self.tier_eviction, TIER_EVICTIONS),
                                     ("--tier-inclusion", self.tier_inclusion, TIER_INCLUSIONS)):
            if value not in names:
                raise InputError(f"expected one of {', '.join(names)}{did_you_mean(str(value), names)}",
                                 field=option, value=value, has_value=True)
        if self.disk_kv_blocks and not self.cpu_kv_blocks:
            raise InputError("a disk tier needs a host tier above it (its blocks pass through host memory); set "
                             "--cpu-kv-memory", field="--disk-kv-memory")
        if self.tier_inclusion == "exclusive" and self.offload_policy != "on-eviction":
            # (a block that left the tiers for the GPU must go down again when the GPU evicts it)
            raise InputError(f"an exclusive tier gets its blocks back only when the GPU evicts them: it needs "
                             f"--offload-policy on-eviction, not {self.offload_policy}", field="--tier-inclusion",
                             value=self.tier_inclusion, has_value=True)
        if not self.has_tiers:
            return
        if self.scheduler == "v1" and not self.prefix_caching:
            raise InputError("the host tier holds prefix-cache blocks: it needs --prefix-caching",
                             field="--cpu-kv-memory")
        if self.scheduler == "v1":
            return
        # v0: the host tier is the swap space, and the prefix cache's tier when prefix caching is on
        if not self.prefix_caching and self.preemption != "swap":
            # (no option named for prefix caching: `run` has none, its v0 never caches)
            raise InputError(f"under --scheduler v0 the host tier is the swap space (--preemption swap) or holds "
                             f"prefix-cache blocks (prefix caching on); with --preemption {self.preemption} and "
                             f"prefix caching off it would hold nothing", field="--cpu-kv-memory (blocks)",
                             value=self.cpu_kv_blocks, has_value=True)
        if self.cpu_blocks and self.cpu_blocks != self.cpu_kv_blocks:
            raise InputError(f"under --scheduler v0 the host tier is the swap space, and --cpu-kv-memory holds "
                             f"{self.cpu_kv_blocks} blocks; give one of the two (or the same number)",
                             field="--cpu-blocks", value=self.cpu_blocks, has_value=True)
        if self.disk_kv_blocks:
            raise InputError("a disk tier under --scheduler v0 is not modelled (v0 swaps into the host tier only); "
                             "use --scheduler v1", field="--disk-kv-memory (blocks)", value=self.disk_kv_blocks,
                             has_value=True)
        if self.layerwise_loads:
            raise InputError("under --scheduler v0 a load from the host tier ends before the step's forward, not "
                             "layer by layer; use --scheduler v1", field="--layerwise-loads", value=True,
                             has_value=True)

    @property
    def has_tiers(self) -> bool:
        """Whether the prefix cache has a tier below the GPU."""
        return self.cpu_kv_blocks > 0

    @property
    def swap_blocks(self) -> int:
        """v0's swap space in blocks: the host tier when there is one (it holds the swapped-out blocks), else
        ``cpu_blocks``."""
        return self.cpu_kv_blocks if self.has_tiers and self.scheduler == "v0" else self.cpu_blocks

    @property
    def tier_settings(self) -> dict[str, int | str | bool]:
        names = ("cpu_kv_blocks", "disk_kv_blocks", "offload_policy", "tier_eviction", "layerwise_loads")
        settings = {name: getattr(self, name) for name in names}
        if self.tier_inclusion != "inclusive":  # (documents of the default keep their bytes: absent is inclusive)
            settings["tier_inclusion"] = self.tier_inclusion
        return settings

    def without_tiers(self) -> SimConfig:
        """The same engine with nothing below the GPU's prefix cache (what the tiers buy is the difference); v0
        keeps its swap space, swapping without the host tier's link clock."""
        return replace(self, cpu_kv_blocks=0, disk_kv_blocks=0, cpu_blocks=self.swap_blocks)

    @property
    def kv_cache_groups(self) -> tuple[KVCacheGroup, ...]:
        return kv_cache_groups(self.model, hybrid=self.hybrid_kv)

    @property
    def watermark_blocks(self) -> int:
        return int(self.watermark * self.num_blocks)

    @property
    def kv_capacity_tokens(self) -> int:
        """Slots: a token's K/V in one KV cache group (in every layer, for a model without sliding windows)."""
        return self.num_blocks * self.block_size

    @property
    def kv_memory_bytes(self) -> int:
        return self.num_blocks * block_bytes(self.model, self.kv_cache_groups, self.block_size)

    @property
    def kv_size_tokens(self) -> int:
        """vLLM's "KV cache size: N tokens" for this pool (``kv_groups.kv_cache_size_tokens``)."""
        return kv_cache_size_tokens(self.kv_cache_groups, self.num_blocks, self.block_size, self.model_len,
                                    self.max_batched_tokens or self.model_len)

    @property
    def max_concurrency(self) -> float:
        """vLLM's "Maximum concurrency for max_model_len tokens per request" for this pool."""
        return max_concurrency(self.kv_cache_groups, self.num_blocks, self.block_size, self.model_len,
                               self.max_batched_tokens or self.model_len)

    def all_full_attention(self) -> SimConfig:
        """The same KV memory with every layer treated as full attention (vLLM's
        --disable-hybrid-kv-cache-manager): fewer, larger blocks."""
        def all_layers(blocks: int) -> int:  # the same bytes in blocks of every layer
            page = block_bytes(self.model, self.kv_cache_groups, self.block_size)
            return num_blocks_for_memory(blocks * page, self.model, self.block_size, hybrid=False)

        return replace(self, hybrid_kv=False, num_blocks=all_layers(self.num_blocks),
                       cpu_kv_blocks=all_layers(self.cpu_kv_blocks), disk_kv_blocks=all_layers(self.disk_kv_blocks))

    @property
    def model_len(self) -> int:
        return self.max_model_len or self.model.max_model_len

    @property
    def prefill_token_limit(self) -> int:
        """Prompt tokens one step may prefill: the chunked-prefill budget, else vLLM v0's unchunked default."""
        return self.max_batched_tokens or max(self.model_len, 2048)

    def allocator(self, strategy: str) -> Allocator:
        """A fresh allocator of ``strategy`` on this capacity."""
        return make_allocator(strategy, num_blocks=self.num_blocks, block_size=self.block_size,
                              max_model_len=self.model_len, prefix_caching=self.prefix_caching,
                              groups=self.kv_cache_groups, max_batched_tokens=self.max_batched_tokens)


def num_blocks_for_memory(kv_memory_bytes: int, model: ModelSpec, block_size: int, *, hybrid: bool = True) -> int:
    """Blocks of ``block_size`` tokens that fit in ``kv_memory_bytes`` of KV for ``model``: vLLM's
    available memory // the bytes of one block (``kv_groups.block_bytes``: every layer's page for a uniform
    model or without the hybrid manager, one group's pages with it)."""
    return math.floor(kv_memory_bytes / block_bytes(model, kv_cache_groups(model, hybrid=hybrid), block_size))
