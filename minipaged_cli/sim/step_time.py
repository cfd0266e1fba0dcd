"""How long a step takes: a pure function of the model, the GPU and the step's batch.

A step runs its kernels one after another, so its time is the sum of theirs:

    weight GEMMs    layers * (tokens * 2 * layer params / (peak FLOP/s * e_gemm_flops)
                              + layer weight bytes / (HBM bandwidth * e_gemm_bw))
    LM head         the same for the vocab x hidden matrix, one row of logits per sequence in the step
    prefill attn    max(attended FLOPs / (peak * e_attn_flops), K/V read / (bandwidth * e_attn_bw))
    decode attn     K/V bytes the decoders read / (bandwidth * e_attn_bw)
    cache writes    K/V bytes of the step's new tokens (and copy-on-write copies, read and written) / same
    overhead        the GPU preset's fixed cost per step: scheduling, launches, sampling

The ``e_*`` are achieved efficiencies of the GPU preset (``configs/gpus/``, each with its source), not the
datasheet's peaks: a GEMM's time is modelled as its FLOP time plus its weight-reading time, fitted to measured
profiles, which a roofline max() of the two peaks underestimates by 20-55 %. A :class:`Calibration` measured on
a GPU replaces any term it covers with interpolation in its table, scaled to this model's shapes when it was
measured on another. K/V moved over the host link (swapping) adds its bytes / host bandwidth.
"""

from __future__ import annotations

from typing import Any

from minipaged_cli.sim.calibration import Calibration
from minipaged_cli.workloads.presets import GpuSpec, ModelSpec


def layer_linear_seconds(model: ModelSpec, gpu: GpuSpec, tokens: Any) -> Any:
    """The efficiency model of one layer's weight GEMMs on ``tokens`` tokens (its QKV, O and MLP matrices)."""
    return (tokens * 2.0 * model.layer_params / (gpu.peak_flops * gpu.gemm_flops_efficiency)
            + model.layer_params * model.dtype_bytes / (gpu.hbm_bandwidth_bytes_per_s * gpu.gemm_bandwidth_efficiency))


class StepTimeModel:
    """Seconds per step for one model on one GPU, optionally calibrated by measurement."""

    def __init__(self, model: ModelSpec, gpu: GpuSpec, calibration: Calibration | None = None) -> None:
        self.model, self.gpu, self.calibration = model, gpu, calibration
        flops, bandwidth = gpu.peak_flops, gpu.hbm_bandwidth_bytes_per_s
        self.lm_head_per_sequence = 2.0 * model.lm_head_params / (flops * gpu.gemm_flops_efficiency)
        self.lm_head_weights = model.lm_head_params * model.dtype_bytes / (bandwidth * gpu.gemm_bandwidth_efficiency)
        self.attention_per_flop = 1.0 / (flops * gpu.attention_flops_efficiency)
        self.kv_per_token = model.kv_bytes_per_token / (bandwidth * gpu.attention_bandwidth_efficiency)
        self.host_per_token = model.kv_bytes_per_token / gpu.host_bandwidth_bytes_per_s
        self.overhead_s = gpu.step_overhead_s

    def step_seconds(self, *, new_tokens: Any, sequences: int, prefill_tokens: int = 0, prefill_attended: float = 0,
                     prefill_context: int = 0, decodes: int = 0, decode_context: Any = 0,
                     copied_tokens: int = 0) -> Any:
        """One step's time (or, given arrays for ``decode_context``, one per step of a run of decode steps).

        ``new_tokens``: tokens the step computes (prefill chunks plus one per decode); ``sequences``: sequences in
        the batch (one row of logits each); ``prefill_tokens``: its prefill chunks' tokens, which attend to
        ``prefill_attended`` (query, key) pairs over ``prefill_context`` tokens of K/V; ``decodes``: decoding
        sequences, reading ``decode_context`` tokens of K/V in all; ``copied_tokens``: copy-on-write copies.
        """
        return (self.linear_seconds(new_tokens)
                + sequences * self.lm_head_per_sequence + self.lm_head_weights
                + self.prefill_attention_seconds(prefill_tokens, prefill_attended, prefill_context)
                + self.decode_attention_seconds(decodes, decode_context)
                + self.cache_write_seconds(new_tokens) + 2 * copied_tokens * self.kv_per_token
                + self.overhead_s)

    def linear_seconds(self, tokens: Any) -> Any:
        model, calibration = self.model, self.calibration
        if calibration is None or calibration.linear is None:
            return model.num_layers * layer_linear_seconds(model, self.gpu, tokens)
        measured = calibration.linear(tokens)
        if not calibration.same_shapes(model):  # the measured model's efficiency, at this model's size
            measured = measured * layer_linear_seconds(model, self.gpu, tokens) / \
                layer_linear_seconds(calibration.model, self.gpu, tokens)
        return model.num_layers * measured

    def prefill_attention_seconds(self, tokens: int, attended: float, context: int) -> Any:
        if not tokens:
            return 0.0
        model, calibration = self.model, self.calibration
        flops = attended * model.attention_flops_per_context_token
        if calibration is not None and calibration.prefill_attention is not None:
            # The FLOP rate measured on one causal prompt as long as the step's prefill tokens.
            measured = calibration.model
            pairs = tokens * (tokens + 1) / 2
            rate = pairs * measured.attention_flops_per_context_token / measured.num_layers / \
                calibration.prefill_attention(tokens)
            return flops / rate
        return max(flops * self.attention_per_flop, context * self.kv_per_token)

    def decode_attention_seconds(self, decodes: int, context: Any) -> Any:
        if not decodes:
            return 0.0
        calibration = self.calibration
        if calibration is None or calibration.decode_attention is None:
            return context * self.kv_per_token
        per_layer = calibration.decode_attention(decodes, context / decodes)
        return self.model.num_layers * per_layer * self._kv_ratio(calibration)

    def cache_write_seconds(self, tokens: Any) -> Any:
        calibration = self.calibration
        if calibration is None or calibration.cache_write is None:
            return tokens * self.kv_per_token
        return self.model.num_layers * calibration.cache_write(tokens) * self._kv_ratio(calibration)

    def _kv_ratio(self, calibration: Calibration) -> float:
        """This model's K/V bytes per token and layer over the measured model's."""
        model, measured = self.model, calibration.model
        return (model.kv_bytes_per_token / model.num_layers) / (measured.kv_bytes_per_token / measured.num_layers)

    def swap_seconds(self, tokens: int) -> float:
        """Moving ``tokens`` tokens of K/V between GPU and CPU memory."""
        return tokens * self.host_per_token
