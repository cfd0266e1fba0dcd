"""The simulator's configuration: one KV capacity, the engine's limits and policies, the model and GPU presets."""

from __future__ import annotations

import math
from dataclasses import dataclass

from minipaged_cli.errors import InputError
from minipaged_cli.memory.allocators import Allocator
from minipaged_cli.memory.strategies import make_allocator
from minipaged_cli.sim.calibration import Calibration
from minipaged_cli.units import format_bytes, parse_bytes
from minipaged_cli.workloads.presets import GpuSpec, ModelSpec

PREEMPTION_MODES = ("recompute", "swap")


@dataclass(frozen=True)
class SimConfig:
    """One capacity for every strategy: ``num_blocks * block_size`` KV slots of ``model.kv_bytes_per_token``."""

    model: ModelSpec
    gpu: GpuSpec
    num_blocks: int
    block_size: int = 16
    max_model_len: int | None = None  # None: the model's
    max_num_seqs: int = 256
    max_batched_tokens: int | None = None  # None: whole prompts, no chunking
    prefix_caching: bool = False  # paged only
    preemption: str = "recompute"  # or "swap"
    cpu_blocks: int = 0  # swap space, in blocks of block_size tokens
    watermark: float = 0.01  # paged admission keeps this fraction of the blocks free (vLLM's default)
    calibration: Calibration | None = None  # measured step times; None: the GPU preset's efficiency model
    check_invariants: bool = False
    record_timeline: bool = False
    record_layout: bool = False  # samples of which sequence owns each slot (sim/layout.py)

    def __post_init__(self) -> None:
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
        if self.preemption == "swap" and self.cpu_blocks == 0:
            raise InputError("swap needs a CPU pool; set --cpu-blocks", field="--cpu-blocks", value=0,
                             has_value=True)
        if not 0.0 <= self.watermark < 1.0:
            raise InputError("must be in [0, 1)", field="--watermark", value=self.watermark, has_value=True)
        if self.calibration is not None:
            self.calibration.check_gpu(self.gpu.name)

    @property
    def watermark_blocks(self) -> int:
        return int(self.watermark * self.num_blocks)

    @property
    def kv_capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def model_len(self) -> int:
        return self.max_model_len or self.model.max_model_len

    @property
    def prefill_token_limit(self) -> int:
        """Prompt tokens one step may prefill: the chunked-prefill budget, else vLLM's unchunked default."""
        return self.max_batched_tokens or max(self.model_len, 2048)

    def allocator(self, strategy: str) -> Allocator:
        """A fresh allocator of ``strategy`` on this capacity."""
        return make_allocator(strategy, num_blocks=self.num_blocks, block_size=self.block_size,
                              max_model_len=self.model_len, prefix_caching=self.prefix_caching,
                              watermark_blocks=self.watermark_blocks)


def num_blocks_for_memory(kv_memory_bytes: int, model: ModelSpec, block_size: int) -> int:
    """Blocks of ``block_size`` tokens that fit in ``kv_memory_bytes`` of KV for ``model``."""
    return math.floor(kv_memory_bytes / (block_size * model.kv_bytes_per_token))


def resolve_num_blocks(model: ModelSpec, gpu_memory_bytes: float, block_size: int, num_blocks: int | None,
                       kv_memory: str | None, gpu_memory_utilization: float) -> tuple[int, str]:
    """The KV capacity in blocks, and a phrase saying where it came from."""
    if block_size < 1:
        raise InputError("must be >= 1", field="--block-size", value=block_size, has_value=True)
    if num_blocks is not None and kv_memory is not None:
        raise InputError("give either --num-blocks or --kv-memory, not both", field="--num-blocks")
    if num_blocks is not None:
        if num_blocks < 1:
            raise InputError("must be >= 1", field="--num-blocks", value=num_blocks, has_value=True)
        return num_blocks, "--num-blocks"
    if kv_memory is not None:
        memory = parse_bytes(kv_memory)
        origin = f"--kv-memory {kv_memory}"
    else:
        if not 0 < gpu_memory_utilization <= 1:
            raise InputError("must be in (0, 1]", field="--gpu-memory-utilization", value=gpu_memory_utilization,
                             has_value=True)
        memory = int(gpu_memory_utilization * gpu_memory_bytes - model.weight_bytes)
        origin = (f"{gpu_memory_utilization:g} of {format_bytes(gpu_memory_bytes)} minus "
                  f"{format_bytes(model.weight_bytes)} of weights")
        if memory <= 0:
            raise InputError(f"the model's weights ({format_bytes(model.weight_bytes)}) leave no KV memory on this "
                             "GPU; pass --kv-memory", field="--gpu")
    blocks = num_blocks_for_memory(memory, model, block_size)
    if blocks < 1:
        block_bytes = format_bytes(block_size * model.kv_bytes_per_token)
        raise InputError(f"holds no block of {block_size} tokens ({block_bytes})", field="--kv-memory",
                         value=kv_memory, has_value=True)
    return blocks, origin
