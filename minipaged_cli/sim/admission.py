"""How each vLLM engine admits a prompt into the KV cache: the scheduler's policy, behind the allocator interface
(the allocators know no engine; they take the blocks to keep free and whether to allocate the first chunk only).

- v1 (``KVCacheManager.allocate_slots``): admission allocates only the blocks of the first chunk, behind a gate
  that the whole prompt would fit (``scheduler_reserve_full_isl``); the watermark holds only while some sequence
  runs (``has_scheduled_reqs``), so a prompt is refused only when it exceeds the whole pool;
- v0 (``BlockSpaceManager.can_allocate``): admission allocates the whole prompt and always keeps the watermark
  free, and a prompt that needs more blocks than the pool has above the watermark is refused at arrival.

vLLM: v1/core/kv_cache_manager.py::KVCacheManager.allocate_slots
vLLM: core/block_manager.py::SelfAttnBlockSpaceManager.can_allocate (v0)
"""

from __future__ import annotations

from dataclasses import dataclass

from minipaged_cli.memory.allocators import Allocator, Holding


@dataclass(frozen=True)
class AdmissionPolicy:
    """An engine's admission rule over any allocator: ``per_chunk`` is v1's (first chunk only, a watermark only
    while some sequence holds blocks), False v0's; ``watermark_blocks`` the blocks admission leaves free."""

    watermark_blocks: int = 0
    per_chunk: bool = True

    @classmethod
    def for_engine(cls, scheduler: str, watermark_blocks: int) -> AdmissionPolicy:
        """The rule of ``scheduler`` ("v1" or "v0", ``EngineSettings.scheduler``)."""
        return cls(watermark_blocks, per_chunk=scheduler == "v1")

    def keep_free_blocks(self, allocator: Allocator) -> int:
        """Blocks admission leaves free now: v1 keeps them only while some sequence holds blocks."""
        if not self.watermark_blocks or (self.per_chunk and not allocator.used_slots):
            return 0
        return self.watermark_blocks

    def headroom(self, allocator: Allocator, holding: Holding, prompt_length: int) -> int:
        """``Allocator.admission_headroom`` under this rule's watermark."""
        keep = self.keep_free_blocks(allocator) if self.watermark_blocks else 0  # (asked at every step: no call)
        return allocator.admission_headroom(holding, prompt_length, keep)

    def can_admit(self, allocator: Allocator, holding: Holding, prompt_length: int) -> bool:
        keep = self.keep_free_blocks(allocator) if self.watermark_blocks else 0
        return allocator.can_admit(holding, prompt_length, keep)

    def rejection_reason(self, allocator: Allocator, holding: Holding) -> str | None:
        """Why the request can never run: v0 also refuses a prompt above the watermark."""
        return allocator.rejection_reason(holding, None if self.per_chunk else self.watermark_blocks)

    def admit(self, allocator: Allocator, holding: Holding, prompt_length: int, num_computed: int | None) -> int:
        """``Allocator.admit``, v1 allocating only the first chunk (``num_computed``); the prefix-cache hits."""
        return allocator.admit(holding, prompt_length, num_computed, first_chunk_only=self.per_chunk)
