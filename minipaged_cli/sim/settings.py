"""The simulator's settings by concern: the engine's, the KV cache's, the tiers below it, the outputs.

Each is a small frozen dataclass checked at construction; ``SimConfig`` (``sim/config.py``) composes them with the
model and the GPU, and fills what is left None with the engine's release's defaults. An error names the setting
(``max_num_seqs``), never a command-line flag: ``cli/flags.py`` maps the names to the flags.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minipaged_cli.errors import InputError, did_you_mean
from minipaged_cli.sim.vllm_releases import LATEST_VLLM, vllm_release
from minipaged_cli.validation import whole_number

PREEMPTION_MODES = ("recompute", "swap")
SCHEDULERS = ("v1", "v0")  # vLLM's v1 engine (the default), and its removed v0 engine (the paper's)
# The prefix cache's tiers below the GPU (sim/tiers.py): when a block goes down, and how a tier evicts.
OFFLOAD_POLICIES = ("write-through", "on-eviction")
TIER_EVICTIONS = ("lru", "arc")
# Whether a block a tier delivers to the GPU stays in that tier (a copy) or leaves it (a move)
TIER_INCLUSIONS = ("inclusive", "exclusive")


def _one_of(setting: str, value: Any, names: tuple[str, ...], hint: bool = False) -> None:
    if value not in names:
        close = did_you_mean(str(value), names) if hint else ""
        raise InputError(f"expected one of {', '.join(names)}{close}", field=f"{{{setting}}}", value=value,
                         has_value=True)


def _at_least(setting: str, value: int | None, minimum: int) -> None:
    if value is not None and value < minimum:
        raise InputError(f"must be >= {minimum}", field=f"{{{setting}}}", value=value, has_value=True)


@dataclass(frozen=True)
class EngineSettings:
    """What the engine schedules, and by which release's rules (``sim/scheduler.py``).

    ``scheduler``: ``v1`` (vLLM's engine today) or ``v0``; ``vllm_version``: the release whose defaults fill what
    is None (``sim/vllm_releases.py``; "0.34.0" is "0.34"). A limit left None is resolved by ``SimConfig``:

    | setting            | v1 (``vllm serve``)                          | v0                 |
    |--------------------|----------------------------------------------|--------------------|
    | max_num_seqs       | ``VllmRelease.batch_defaults``: 1024 or 256  | 256                |
    | max_batched_tokens | ``VllmRelease.batch_defaults``: 8192 or 2048 | None: whole prompts|
    | watermark          | 0.0                                          | 0.01               |
    | cache-aware window | 0: off (0.34.0's option; 0.33 has none)      | -                  |

    vLLM 0.34.0's cache-aware admission (v1): while the KV cache's usage is at least the threshold, the first
    ``cache_aware_admission_window`` waiting requests are admitted deepest cached prefix first (0: arrival order).
    """

    scheduler: str = "v1"
    vllm_version: str = LATEST_VLLM
    max_num_seqs: int | None = None
    max_batched_tokens: int | None = None  # v0: None prefills whole prompts (no chunking)
    watermark: float | None = None  # paged admission keeps this fraction of the blocks free
    preemption: str = "recompute"  # or "swap" (v0 only)
    long_prefill_token_threshold: int = 0  # v1: most prompt tokens one request prefills a step; 0: no limit
    cache_aware_admission_window: int | None = None
    cache_aware_admission_threshold: float | None = None

    def __post_init__(self) -> None:
        _one_of("scheduler", self.scheduler, SCHEDULERS)
        release = vllm_release(self.vllm_version)
        object.__setattr__(self, "vllm_version", release.version)  # frozen: "0.34.0" is "0.34"
        _at_least("max_num_seqs", self.max_num_seqs, 1)
        _at_least("max_batched_tokens", self.max_batched_tokens, 1)
        _one_of("preemption", self.preemption, PREEMPTION_MODES)
        if self.preemption == "swap" and self.v1:
            raise InputError("vLLM v1 preempts by recompute only; swap is the v0 engine's ({scheduler=v0})",
                             field="{preemption}", value=self.preemption, has_value=True)
        _at_least("long_prefill_token_threshold", self.long_prefill_token_threshold, 0)
        if self.watermark is not None and not 0.0 <= self.watermark < 1.0:
            raise InputError("must be in [0, 1)", field="{watermark}", value=self.watermark, has_value=True)
        window = self.cache_aware_admission_window
        if window is not None:
            window = whole_number(window, field="{cache_aware_admission_window}", minimum=0)
        if window and release.cache_aware_admission_window is None:
            raise InputError(f"cache-aware admission is vLLM 0.34.0's; vLLM {release.wheel} admits in arrival "
                             "order ({vllm_version=0.34})", field="{cache_aware_admission_window}", value=window,
                             has_value=True)
        if window and not self.v1:
            raise InputError("cache-aware admission is a v1 scheduler option ({scheduler=v1})",
                             field="{cache_aware_admission_window}", value=window, has_value=True)
        threshold = self.cache_aware_admission_threshold
        if threshold is not None and not 0.0 <= threshold <= 1.0:
            raise InputError("must be in [0, 1]", field="{cache_aware_admission_threshold}", value=threshold,
                             has_value=True)

    @property
    def v1(self) -> bool:
        return self.scheduler == "v1"

    def prefill_token_limit(self, model_len: int) -> int:
        """Prompt tokens one step may prefill: the chunked-prefill budget, else vLLM v0's unchunked default."""
        return self.max_batched_tokens or max(model_len, 2048)


@dataclass(frozen=True)
class CacheSettings:
    """The GPU's KV cache: ``num_blocks`` blocks of ``block_size`` tokens (None: the release's for the model and
    GPU, ``VllmRelease.block_size``; v0's 16), prefix caching (None: on under v1, off under v0), vLLM v1's hybrid
    KV cache manager (a group per attention type, sliding windows free what they no longer see,
    ``memory/kv_groups.py``; None: on under v1; False treats every layer as full attention), and v0's swap space
    of ``cpu_blocks`` blocks."""

    num_blocks: int
    block_size: int | None = None
    prefix_caching: bool | None = None  # paged only
    hybrid_kv: bool | None = None
    cpu_blocks: int = 0  # swap space, in blocks of block_size tokens

    def __post_init__(self) -> None:
        _at_least("num_blocks", self.num_blocks, 1)
        _at_least("block_size", self.block_size, 1)
        _at_least("cpu_blocks", self.cpu_blocks, 0)

    @property
    def kv_capacity_tokens(self) -> int:
        """Slots: a token's K/V in one KV cache group (in every layer, for a model without sliding windows)."""
        assert self.block_size is not None, "a SimConfig resolves the block size"
        return self.num_blocks * self.block_size


@dataclass(frozen=True)
class TierSettings:
    """Tiers below the GPU's prefix cache (``sim/tiers.py``; paged with prefix caching; under v0 the host tier
    alone, which is also the swap space).

    ``cpu_kv_blocks`` of host memory and ``disk_kv_blocks`` of local disk under it, in the pool's blocks
    (``block_size`` tokens; one KV cache group's layers under the hybrid manager); ``offload_policy`` says when a
    block goes down (``write-through``: every computed full block, as vLLM's OffloadingConnector and LMCache store;
    ``on-eviction``: when the tier above evicts it), ``tier_eviction`` how each tier evicts (``lru``, or ``arc`` as
    vLLM's ARC policy), ``tier_inclusion`` whether a block the GPU caches stays in the tiers below (``inclusive``,
    as vLLM's connector, LMCache and SGLang HiCache keep it) or leaves them (``exclusive``: one copy of a block in
    the whole hierarchy; needs ``on-eviction``), ``layerwise_loads`` whether a load overlaps the request's prefill
    layer by layer (LMCache's layerwise mode) instead of finishing first (vLLM's connector).
    """

    cpu_kv_blocks: int = 0
    disk_kv_blocks: int = 0
    offload_policy: str = "write-through"
    tier_eviction: str = "lru"
    tier_inclusion: str = "inclusive"
    layerwise_loads: bool = False

    def __post_init__(self) -> None:
        whole_number(self.cpu_kv_blocks, field="{cpu_kv_blocks}", minimum=0)
        whole_number(self.disk_kv_blocks, field="{disk_kv_blocks}", minimum=0)
        _one_of("offload_policy", self.offload_policy, OFFLOAD_POLICIES, hint=True)
        _one_of("tier_eviction", self.tier_eviction, TIER_EVICTIONS, hint=True)
        _one_of("tier_inclusion", self.tier_inclusion, TIER_INCLUSIONS, hint=True)
        if self.disk_kv_blocks and not self.cpu_kv_blocks:
            raise InputError("a disk tier needs a host tier above it (its blocks pass through host memory); set "
                             "{cpu_kv_memory}", field="{disk_kv_memory}")
        if self.tier_inclusion == "exclusive" and self.offload_policy != "on-eviction":
            # (a block that left the tiers for the GPU must go down again when the GPU evicts it)
            raise InputError(f"an exclusive tier gets its blocks back only when the GPU evicts them: it needs "
                             f"{{offload_policy=on-eviction}}, not {self.offload_policy}", field="{tier_inclusion}",
                             value=self.tier_inclusion, has_value=True)

    @property
    def has_tiers(self) -> bool:
        """Whether the prefix cache has a tier below the GPU."""
        return self.cpu_kv_blocks > 0

    def to_dict(self) -> dict[str, int | str | bool]:
        """The settings as a document writes them."""
        names = ("cpu_kv_blocks", "disk_kv_blocks", "offload_policy", "tier_eviction", "layerwise_loads")
        settings = {name: getattr(self, name) for name in names}
        if self.tier_inclusion != "inclusive":  # (documents of the default keep their bytes: absent is inclusive)
            settings["tier_inclusion"] = self.tier_inclusion
        return settings


@dataclass(frozen=True)
class OutputSettings:
    """What a replay records beyond its metrics: invariant checks each step, the timeline, layout samples of which
    sequence owns each slot (``sim/layout.py``)."""

    check_invariants: bool = False
    record_timeline: bool = False
    record_layout: bool = False
