"""How long a step takes: a pure function of the model, the GPU and the step's batch.

A step runs its kernels one after another, so its time is the sum of theirs:

    weight GEMMs    layers * (tokens * 2 * layer params / (peak FLOP/s * e_gemm_flops)
                              + layer weight bytes / (HBM bandwidth * e_gemm_bw))
    LM head         the same for the vocab x hidden matrix, one row of logits per sequence in the step
    element-wise    layers * tokens * bytes the norms, residual adds, RoPE and activation read and write
                              / (HBM bandwidth * e_attn_bw)
    prefill attn    max(attended FLOPs / (peak * e_attn_flops), K/V read / (bandwidth * e_attn_bw))
    decode attn     K/V bytes the decoders read / (bandwidth * e_attn_bw)
    cache writes    K/V bytes of the step's new tokens (and copy-on-write copies, read and written) / same
    overhead        the GPU preset's fixed cost per step: scheduling, launches, sampling

The ``e_*`` are achieved efficiencies of the GPU preset (``configs/gpus/``, each with its source), not the
datasheet's peaks: a GEMM's time is modelled as its FLOP time plus its weight-reading time, fitted to measured
profiles, which a roofline max() of the two peaks underestimates by 20-55 %. A :class:`Calibration` measured on
a GPU replaces any term it covers with interpolation in its table, scaled to this model's shapes when it was
measured on another; past its last point a table follows the efficiency model's shape for its term (a prompt 8x
longer than the longest measured costs ~64x its prefill attention, not 8x). K/V moved over the host link
(swapping) adds its bytes / host bandwidth.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from minipaged_cli.sim.calibration import Calibration
from minipaged_cli.workloads.presets import GpuSpec, ModelSpec


def layer_linear_seconds(model: ModelSpec, gpu: GpuSpec, tokens: Any) -> Any:
    """The efficiency model of one layer's weight GEMMs on ``tokens`` tokens (its QKV, O and MLP matrices)."""
    return (tokens * 2.0 * model.layer_params / (gpu.peak_flops * gpu.gemm_flops_efficiency)
            + model.layer_params * model.dtype_bytes / (gpu.hbm_bandwidth_bytes_per_s * gpu.gemm_bandwidth_efficiency))


def elementwise_bytes_per_token(model: ModelSpec) -> int:
    """What one layer's element-wise kernels read and write per token, fused as an engine runs them (vLLM's): two
    RMSNorms each with its residual add (hidden state and residual in, both out), RoPE on Q and K (in and out), the
    activation (gate and up in, one out; a plain MLP's: one in, one out). Unfused kernels move more; a calibration
    measures what yours do."""
    q_width, kv_width = model.num_q_heads * model.head_dim, model.num_kv_heads * model.head_dim
    activation = (3 if model.gated_mlp else 2) * model.intermediate_size
    return (2 * 4 * model.hidden_size + 2 * (q_width + kv_width) + activation) * model.dtype_bytes


def layer_elementwise_seconds(model: ModelSpec, gpu: GpuSpec, tokens: Any) -> Any:
    """The efficiency model of one layer's element-wise kernels: memory-bound, at the attention kernels' share of
    the bandwidth (they stream like them; their launches are in ``step_overhead_s``)."""
    return tokens * elementwise_bytes_per_token(model) / \
        (gpu.hbm_bandwidth_bytes_per_s * gpu.attention_bandwidth_efficiency)


def layer_prefill_attention_seconds(model: ModelSpec, gpu: GpuSpec, attended: Any, context: Any) -> Any:
    """The efficiency model of one layer's prefill attention: ``attended`` (query, key) pairs over ``context``
    tokens of K/V, bound by FLOPs or by reading the K/V, whichever takes longer."""
    flops = attended * model.attention_flops_per_context_token / model.num_layers
    kv_bytes = context * model.kv_bytes_per_token / model.num_layers
    return np.maximum(flops / (gpu.peak_flops * gpu.attention_flops_efficiency),
                      kv_bytes / (gpu.hbm_bandwidth_bytes_per_s * gpu.attention_bandwidth_efficiency))


def causal_pairs(tokens: Any) -> Any:
    """(query, key) pairs of causal attention over one prompt of ``tokens`` tokens."""
    return tokens * (tokens + 1) / 2


class StepTimeModel:
    """Seconds per step for one model on one GPU, optionally calibrated by measurement."""

    def __init__(self, model: ModelSpec, gpu: GpuSpec, calibration: Calibration | None = None) -> None:
        self.model, self.gpu, self.calibration = model, gpu, calibration
        flops, bandwidth = gpu.peak_flops, gpu.hbm_bandwidth_bytes_per_s
        self.lm_head_per_sequence = 2.0 * model.lm_head_params / (flops * gpu.gemm_flops_efficiency)
        self.lm_head_weights = model.lm_head_params * model.dtype_bytes / (bandwidth * gpu.gemm_bandwidth_efficiency)
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
        return (self.linear_seconds(new_tokens) + self.elementwise_seconds(new_tokens)
                + sequences * self.lm_head_per_sequence + self.lm_head_weights
                + self.prefill_attention_seconds(prefill_tokens, prefill_attended, prefill_context)
                + self.decode_attention_seconds(decodes, decode_context)
                + self.cache_write_seconds(new_tokens) + 2 * copied_tokens * self.kv_per_token
                + self.overhead_s)

    def linear_seconds(self, tokens: Any) -> Any:
        return self._per_token_term("linear", layer_linear_seconds, tokens)

    def elementwise_seconds(self, tokens: Any) -> Any:
        """The norms, RoPE, the activation and the residual adds of every layer on ``tokens`` tokens."""
        return self._per_token_term("elementwise", layer_elementwise_seconds, tokens)

    def _per_token_term(self, name: str, layer_model: Callable[[ModelSpec, GpuSpec, Any], Any], tokens: Any) -> Any:
        """A term that depends on the step's tokens only: the calibration's table ``name`` where it has one (past
        its last point, shaped like ``layer_model``), else ``layer_model``; per layer, times the layers."""
        model, gpu, calibration = self.model, self.gpu, self.calibration
        table = None if calibration is None else getattr(calibration, name)
        if table is None:
            return model.num_layers * layer_model(model, gpu, tokens)
        measured = table(tokens, shape=lambda n: layer_model(calibration.model, gpu, n))
        if not calibration.same_shapes(model):  # the measured model's efficiency, at this model's size
            measured = measured * layer_model(model, gpu, tokens) / layer_model(calibration.model, gpu, tokens)
        return model.num_layers * measured

    def prefill_attention_seconds(self, tokens: int, attended: float, context: int) -> Any:
        if not tokens:
            return 0.0
        model, gpu, calibration = self.model, self.gpu, self.calibration
        if calibration is None or calibration.prefill_attention is None:
            return model.num_layers * layer_prefill_attention_seconds(model, gpu, attended, context)
        # The FLOP rate measured on one causal prompt as long as the step's prefill tokens (past the longest
        # measured, that prompt's time grows as the efficiency model's: with the square of its length).
        measured = calibration.model

        def one_prompt(n: Any) -> Any:
            return layer_prefill_attention_seconds(measured, gpu, causal_pairs(n), n)

        rate = causal_pairs(tokens) * measured.attention_flops_per_context_token / measured.num_layers / \
            calibration.prefill_attention(tokens, shape=one_prompt)
        return attended * model.attention_flops_per_context_token / rate

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
