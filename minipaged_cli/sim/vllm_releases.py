"""The defaults each supported vLLM release applies, in one table: what ``vllm serve`` gives a user who sets
nothing, and what minipaged therefore takes where its user sets nothing (an option the user gives always wins).

Every value is read from the release's wheel (``vllm/config/cache.py``, ``vllm/config/scheduler.py``,
``vllm/engine/arg_utils.py``, the attention backends under ``vllm/v1/attention/backends/``);
``tests/parity/test_vllm_defaults.py`` reads them again from the installed wheel in the parity venv
(``parity/setup_env.sh``) and fails when a release's code and this table part. ``docs/vllm-releases.md`` says
what moved between releases.
"""

from __future__ import annotations

from dataclasses import dataclass

from minipaged_cli.errors import InputError, did_you_mean
from minipaged_cli.workloads.presets import GpuSpec, ModelSpec

GIB = 2**30


@dataclass(frozen=True)
class BatchTier:
    """``EngineArgs.get_batch_defaults`` for ``vllm serve`` (its OPENAI_API_SERVER usage context): GPUs with at
    least ``min_memory_gib`` of memory (and not an A100 where ``excludes_a100``) get these limits."""

    min_memory_gib: float
    excludes_a100: bool
    max_num_batched_tokens: int
    max_num_seqs: int

    def applies(self, gpu: GpuSpec) -> bool:
        if self.excludes_a100 and "a100" in gpu.name.lower():
            return False
        return gpu.reported_memory_bytes >= self.min_memory_gib * GIB


# vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults, in the order it tests them (the same in 0.33.0 and
# 0.34.0): B200-class (>= 160 GiB), then H100/H200-class (>= 70 GiB, not an A100: a larger budget slowed A100s,
# vLLM PR #17885), then every other GPU.
_BATCH_TIERS = (BatchTier(160, False, 16384, 1024), BatchTier(70, True, 8192, 1024), BatchTier(0, False, 2048, 256))


@dataclass(frozen=True)
class VllmRelease:
    """One release's defaults (the names are vLLM's)."""

    version: str  # what --vllm-version takes
    wheel: str  # the release on PyPI whose code these values are read from
    # CacheConfig.DEFAULT_BLOCK_SIZE: what the platform offers the attention backends (``default_block_size``)
    default_block_size: int
    # CacheConfig.enable_extensible_kv_cache, as resolved on CUDA with a driver that has virtual memory management
    # (None there: on unless kv_cache_memory_bytes is set). True: the KV cache is sized from the memory free after
    # warmup and CUDA graph capture; False: from a profiling estimate (``sim/kv_sizing.py`` has both rules).
    extensible_kv_cache: bool
    # CacheConfig.gpu_memory_utilization when unset: 1.0 with the extensible KV cache, else
    # DEFAULT_GPU_MEMORY_UTILIZATION (0.92)
    gpu_memory_utilization: float
    # SchedulerConfig's scheduler options (0.34.0's cache-aware admission; None: the release has no such option)
    cache_aware_admission_window: int | None
    cache_aware_admission_threshold: float | None
    has_max_num_inflight_kv_loads: bool  # SchedulerConfig.max_num_inflight_kv_loads (default None: no cap)
    # Unchanged between the supported releases, kept here so that the drift test reads every one of them:
    watermark: float = 0.0  # SchedulerConfig.watermark
    enable_prefix_caching: bool = True  # CacheConfig.enable_prefix_caching
    prefix_caching_hash_algo: str = "sha256"  # CacheConfig.prefix_caching_hash_algo
    enable_chunked_prefill: bool = True  # SchedulerConfig.enable_chunked_prefill
    long_prefill_token_threshold: int = 0  # SchedulerConfig.long_prefill_token_threshold
    # SchedulerConfig.async_scheduling: None, resolved to True on CUDA for a plain model. minipaged's steps are
    # synchronous (a step's output reaches the scheduler before the next step is scheduled): async scheduling
    # overlaps the host's work with the GPU's, which changes no scheduling decision but the step's timing.
    async_scheduling: bool = True
    estimate_gpu_memory_utilization: float = 0.92  # CacheConfig.DEFAULT_GPU_MEMORY_UTILIZATION (0.33.0: the field's)
    batch_tiers: tuple[BatchTier, ...] = _BATCH_TIERS

    def batch_defaults(self, gpu: GpuSpec) -> tuple[int, int]:
        """(max_num_batched_tokens, max_num_seqs) as ``vllm serve`` sets them on ``gpu`` when not given."""
        tier = next(t for t in self.batch_tiers if t.applies(gpu))
        return tier.max_num_batched_tokens, tier.max_num_seqs

    def block_size(self, model: ModelSpec, gpu: GpuSpec) -> int:
        """The KV block size vLLM picks for ``model`` on ``gpu`` when ``--block-size`` is not given.

        The platform offers ``default_block_size`` to the attention backend CUDA selects
        (``Platform.update_block_size_for_backend``); a backend that cannot run it answers with its own smallest
        kernel block size (``AttentionBackend.get_preferred_block_size``):

        - full attention and sliding windows: FLASH_ATTN on an A100 and on Hopper, any multiple of 16, so the
          default. Sliding-window layers share that backend, and with their full-attention peers' shapes their
          pages are equal: no alignment moves it (``_align_hybrid_block_size`` is for Mamba hybrids);
        - latent attention (MLA): FLASH_ATTN_MLA on Hopper (multiples of 16) when the KV cache is in the model's
          dtype; with an fp8 KV cache it cannot run and FLASHMLA, whose only kernel block size is 64, takes over;
          before Hopper TRITON_MLA (multiples of 16).
        """
        if model.is_mla and model.kv_cache_dtype != "auto" and gpu.compute_capability >= 9.0:
            return max(self.default_block_size, FLASHMLA_BLOCK_SIZE)
        return self.default_block_size


FLASHMLA_BLOCK_SIZE = 64  # FlashMLABackend.get_supported_kernel_block_sizes

VLLM_RELEASES = {
    "0.34": VllmRelease(version="0.34", wheel="0.34.0", default_block_size=64, extensible_kv_cache=True,
                        gpu_memory_utilization=1.0, cache_aware_admission_window=0,
                        cache_aware_admission_threshold=0.5, has_max_num_inflight_kv_loads=True),
    "0.33": VllmRelease(version="0.33", wheel="0.33.0", default_block_size=16, extensible_kv_cache=False,
                        gpu_memory_utilization=0.92, cache_aware_admission_window=None,
                        cache_aware_admission_threshold=None, has_max_num_inflight_kv_loads=False),
}
LATEST_VLLM = "0.34"  # the default of --vllm-version: the newest supported release


def vllm_release(version: str) -> VllmRelease:
    """The release ``version`` names ("0.34", or its wheel's "0.34.0")."""
    for release in VLLM_RELEASES.values():
        if version in (release.version, release.wheel):
            return release
    raise InputError(f"expected one of {', '.join(VLLM_RELEASES)}{did_you_mean(str(version), list(VLLM_RELEASES))}",
                     field="{vllm_version}", value=version, has_value=True)
