"""The CUDA kernels of ``cuda/`` as a backend, over one abstract launch.

Everything a launch needs but the launch itself lives here, once: which kernel, which grid and block, which
arguments in the ``.cu`` order, and the launch rules of ``kernels`` (aligned 16-byte paths, no empty grid, the
split plan). A subclass says only how to launch a named kernel: on a GPU through PyCUDA (``cuda``), or on the CPU
through the emulation (``emulation``).
"""

from __future__ import annotations

from abc import abstractmethod

import torch

from minipaged_cli.dataplane import kernels
from minipaged_cli.dataplane.backends import Backend

Dim3 = tuple[int, int, int]


class KernelBackend(Backend):
    num_sms: int  # the split plan fills this many SMs
    capability: tuple[int, int]  # the GPU's compute capability (what fp8 needs: kernels.FP8_MIN_ARCH)
    tokens_per_split: int | None = None  # None: the plan's choice
    attention_variant: str = "auto"  # kernels.ATTENTION_VARIANTS: which decode-attention kernel runs

    @abstractmethod
    def launch(self, source: str, name: str, grid: Dim3, block: Dim3, args: list[kernels.KernelArg]) -> None:
        """Run kernel ``name`` of ``cuda/<source>.cu`` on ``grid`` x ``block`` threads with ``args`` (tensors
        are passed as their data pointers), in order with the work already queued on the tensors."""

    def _cache_write(self, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                     value_cache: torch.Tensor, slot_mapping: torch.Tensor, k_scale: torch.Tensor | None,
                     v_scale: torch.Tensor | None) -> None:
        if key.shape[0] == 0:
            return
        key, value, vectorized = kernels.cache_write_operands(key, value, key_cache, value_cache)
        if value.dtype != key.dtype:  # an fp8 cache takes any float dtype; the kernel reads key's for both
            value = value.to(key.dtype)
        self.launch("cache_write", kernels.cache_write_kernel(key.dtype, key_cache.dtype), (key.shape[0], 1, 1),
                    (kernels.CACHE_WRITE_THREADS, 1, 1),
                    kernels.cache_write_args(key, value, key_cache, value_cache, slot_mapping, vectorized, k_scale,
                                             v_scale))

    def _copy_blocks(self, key_cache: torch.Tensor, value_cache: torch.Tensor, block_mapping: torch.Tensor) -> None:
        self.launch("copy_blocks", "copy_blocks", (block_mapping.shape[0], 1, 1), (kernels.COPY_BLOCKS_THREADS, 1, 1),
                    kernels.copy_blocks_args(key_cache, value_cache, block_mapping))

    def _paged_attention(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                         block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                         k_scale: torch.Tensor | None, v_scale: torch.Tensor | None) -> torch.Tensor:
        # One host sync for the longest sequence and the total: they size the split plan (launch_attention takes
        # them known).
        query = kernels.attention_operands(query, key_cache, value_cache)
        longest, total = torch.stack([seq_lens.max(), seq_lens.sum()]).tolist()
        return self.launch_attention(query, key_cache, value_cache, block_tables.contiguous(),
                                     seq_lens.contiguous(), scale, int(longest), int(total), k_scale, v_scale)

    def launch_attention(self, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                         block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                         max_seq_len: int, total_tokens: int | None = None, k_scale: torch.Tensor | None = None,
                         v_scale: torch.Tensor | None = None) -> torch.Tensor:
        """The launches alone, unvalidated and without a host sync: contiguous, aligned arguments, checked already
        (a non-empty batch). ``total_tokens`` (the sum of ``seq_lens``) lets the plan split a skewed batch; k_scale,
        v_scale [num_kv_heads] come with an fp8 cache."""
        batch, num_q_heads, head_dim = query.shape
        num_kv_heads = key_cache.shape[1]
        plan = kernels.plan_attention(query, num_kv_heads, max_seq_len, self.num_sms, self.tokens_per_split,
                                      total_tokens)
        source, name = kernels.attention_kernel(query.dtype, head_dim, plan.group, self.attention_variant,
                                                key_cache.dtype)
        self.launch(source, name, (num_kv_heads, batch, plan.num_splits), (kernels.NUM_THREADS, 1, 1),
                    kernels.attention_args(plan, query, key_cache, value_cache, block_tables, seq_lens, scale,
                                           k_scale, v_scale))
        if plan.num_splits > 1:
            self.launch("paged_attention", kernels.merge_kernel(query.dtype, head_dim), (num_q_heads, batch, 1),
                        (head_dim, 1, 1), kernels.merge_args(plan, seq_lens))
        return plan.out

    def unsupported(self, num_q_heads: int, num_kv_heads: int, head_dim: int,
                    kv_cache_dtype: str = "auto") -> str | None:
        return kernels.unsupported_reason(head_dim, num_q_heads // num_kv_heads, kv_cache_dtype, self.capability)
