"""How long a step takes: a roofline of the GPU preset, a pure function of the model, the GPU and the step's batch.

A step processes ``num_new_tokens`` (prefill chunks and one token per decode) that attend to ``attended`` cached
tokens in all, and reads or writes ``kv_tokens_moved`` tokens of K/V. It lasts

    max(compute, memory) + overhead
    compute = num_new_tokens * 2 * params / peak_flops + attended * attention FLOPs per token / peak_flops
    memory  = weight bytes / HBM bandwidth + kv_tokens_moved * KV bytes per token / HBM bandwidth

and K/V moved over the host link (swapping) adds its bytes / host bandwidth.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from minipaged_cli.workloads.presets import GpuSpec, ModelSpec


@dataclass(frozen=True)
class StepTimeModel:
    """The roofline's coefficients, in seconds per unit of work."""

    seconds_per_token: float  # the weight GEMMs of one token
    seconds_per_attended_token: float  # attention FLOPs of one query token against one cached token
    seconds_for_weights: float  # reading every weight once
    seconds_per_kv_token: float  # reading or writing one token's K/V (all layers)
    seconds_per_host_token: float  # one token's K/V over the host link
    overhead_s: float  # a step's fixed cost: launches, scheduling

    @classmethod
    def for_presets(cls, model: ModelSpec, gpu: GpuSpec) -> StepTimeModel:
        return cls(
            seconds_per_token=2.0 * model.num_params / gpu.peak_flops,
            seconds_per_attended_token=model.attention_flops_per_context_token / gpu.peak_flops,
            seconds_for_weights=model.weight_bytes / gpu.hbm_bandwidth_bytes_per_s,
            seconds_per_kv_token=model.kv_bytes_per_token / gpu.hbm_bandwidth_bytes_per_s,
            seconds_per_host_token=model.kv_bytes_per_token / gpu.host_bandwidth_bytes_per_s,
            overhead_s=gpu.step_overhead_s,
        )

    def step_seconds(self, num_new_tokens: Any, attended: Any, kv_tokens_moved: Any) -> Any:
        """Duration of steps (floats, or NumPy arrays of them, one per step)."""
        compute = num_new_tokens * self.seconds_per_token + attended * self.seconds_per_attended_token
        memory = self.seconds_for_weights + kv_tokens_moved * self.seconds_per_kv_token
        return np.maximum(compute, memory) + self.overhead_s

    def swap_seconds(self, tokens: int) -> float:
        """Moving ``tokens`` tokens of K/V between GPU and CPU memory."""
        return tokens * self.seconds_per_host_token
