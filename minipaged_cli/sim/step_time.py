"""How long a step takes: a pure function of the model, the GPU and the step's batch.

A step runs its kernels one after another, so its time is the sum of theirs:

    weight GEMMs    layers * (tokens * 2 * layer params / (peak FLOP/s * e_gemm_flops)
                              + layer weight bytes / (HBM bandwidth * e_gemm_bw))
                    (MoE: the params one token uses; the bytes of all but the routed experts, plus the experts
                    the step's tokens touch: ``experts_touched``)
    LM head         the same for the vocab x hidden matrix, one row of logits per sequence in the step
    element-wise    layers * tokens * bytes the norms, residual adds, RoPE and activation read and write
                              / (HBM bandwidth * e_attn_bw)
    prefill attn    max(attended FLOPs / (peak * e_attn_flops), K/V read / (bandwidth * e_attn_bw)) (a query of a
                    sliding-window layer attends to at most the window: ``prefill_attention_seconds``)
    decode attn     K/V bytes the decoders read / (bandwidth * e_attn_bw) (a sliding-window layer reads at
                    most the window of each decoder: ``decode_attention_seconds``)
    cache writes    K/V bytes of the step's new tokens (and copy-on-write copies, read and written) / same
    overhead        the GPU preset's fixed cost per step: scheduling, launches, sampling

The ``e_*`` are achieved efficiencies of the GPU preset (``configs/gpus/``, each with its source), not the
datasheet's peaks: a GEMM's time is modelled as its FLOP time plus its weight-reading time, fitted to measured
profiles, which a roofline max() of the two peaks underestimates by 20-55 %. A :class:`Calibration` measured on
a GPU replaces any term it covers with interpolation in its table, scaled to this model's shapes when it was
measured on another; past its last point a table follows the efficiency model's shape for its term (a prompt 8x
longer than the longest measured costs ~64x its prefill attention, not 8x). K/V moved over the host link
(swapping) adds its bytes / host bandwidth.

K/V bytes are the model's ``kv_bytes_per_token_per_layer``: its KV cache dtype (fp8 halves them) and, with
multi-head latent attention, the latent vector, whose FLOPs are ``ModelSpec.attention_flops_per_context_token``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

from minipaged_cli.workloads.presets import GpuSpec, ModelSpec

if TYPE_CHECKING:  # (a calibration is loaded where one is given: cli/common.py)
    from minipaged_cli.sim.calibration import Calibration


def elementwise_bytes_per_token(model: ModelSpec) -> int:
    """What one layer's element-wise kernels read and write per token, fused as an engine runs them (vLLM's): two
    RMSNorms each with its residual add (hidden state and residual in, both out), RoPE on Q and K (in and out), the
    activation (gate and up in, one out; a plain MLP's: one in, one out; a MoE layer's for each expert a token
    goes to). Multi-head latent attention ropes only its rotary parts (qk_rope_head_dim per head of Q, once for
    the key shared by all heads) and normalises its latents (q_lora_rank and kv_lora_rank, in and out), as
    DeepSeek-V3's q_a_layernorm and kv_a_layernorm do. Unfused kernels move more; a calibration measures what
    yours do."""
    if model.qk_rope_head_dim is not None and model.kv_lora_rank is not None:
        roped = (model.num_q_heads + 1) * model.qk_rope_head_dim + (model.q_lora_rank or 0) + model.kv_lora_rank
    else:
        roped = (model.num_q_heads + model.num_kv_heads) * model.head_dim
    activation = (3 if model.gated_mlp else 2) * model.active_intermediate_size
    return (2 * 4 * model.hidden_size + 2 * roped + activation) * model.dtype_bytes


def experts_touched(model: ModelSpec, tokens: Any) -> Any:
    """Routed experts of one MoE layer that ``tokens`` tokens use between them, expected under uniform routing:
    each token picks num_experts_per_tok of the num_experts, independently of the others, so an expert escapes
    all of them with probability (1 - k/E)^tokens. One token touches k, a large batch all E."""
    num_experts, per_token = model.num_experts or 0, model.num_experts_per_tok or 0
    return num_experts * (1.0 - (1.0 - per_token / num_experts) ** tokens) if num_experts else 0.0


def causal_pairs(tokens: Any) -> Any:
    """(query, key) pairs of causal attention over one prompt of ``tokens`` tokens."""
    return tokens * (tokens + 1) / 2


def _at_most(values: Any, limit: Any) -> Any:
    """min(values, limit), a plain number for one step (the replay's hot path), an array for a run of steps."""
    return np.minimum(values, limit) if isinstance(values, np.ndarray) else min(values, limit)


class LayerModel:
    """The efficiency model of one layer's kernels, in seconds (its coefficients computed once: the replay asks per
    step). A calibrated term past its table's last point scales as the measured model's term does here."""

    def __init__(self, model: ModelSpec, gpu: GpuSpec) -> None:
        flops, bandwidth = gpu.peak_flops, gpu.hbm_bandwidth_bytes_per_s
        streaming = bandwidth * gpu.attention_bandwidth_efficiency
        self.model = model
        weight_rate = model.num_layers * bandwidth * gpu.gemm_bandwidth_efficiency  # (bytes averaged per layer)
        self.gemm_per_token = 2.0 * model.active_layers_params / model.num_layers / (flops * gpu.gemm_flops_efficiency)
        self.gemm_weights = model.read_weight_bytes / weight_rate
        # One routed expert of every MoE layer: a step reads as many as its tokens touch.
        self.expert_weights = model.num_moe_layers * model.expert_params * model.expert_weight_bytes / weight_rate
        # Element-wise kernels stream like attention's; their launches are in step_overhead_s.
        self.elementwise_per_token = elementwise_bytes_per_token(model) / streaming
        self.attention_per_pair = model.attention_flops_per_context_token / model.num_layers / \
            (flops * gpu.attention_flops_efficiency)
        self.kv_per_token = model.kv_bytes_per_token / model.num_layers / streaming

    def linear(self, tokens: Any) -> Any:
        """The weight GEMMs (QKV, O, MLP) on ``tokens`` tokens: their FLOPs plus reading their weights."""
        seconds = tokens * self.gemm_per_token + self.gemm_weights
        if self.expert_weights:
            seconds = seconds + self.expert_weights * experts_touched(self.model, tokens)
        return seconds

    def elementwise(self, tokens: Any) -> Any:
        """The norms, residual adds, RoPE and activation on ``tokens`` tokens: memory-bound."""
        return tokens * self.elementwise_per_token

    def prefill_attention(self, attended: Any, context: Any) -> Any:
        """``attended`` (query, key) pairs over ``context`` tokens of K/V: FLOP- or K/V-read-bound, the longer."""
        flops, reads = attended * self.attention_per_pair, context * self.kv_per_token
        if not isinstance(flops, np.ndarray) and not isinstance(reads, np.ndarray):  # one step: plain numbers
            return max(flops, reads)
        return np.maximum(flops, reads)

    def one_prompt(self, tokens: Any) -> Any:
        """Prefill attention over one causal prompt of ``tokens`` tokens."""
        return self.prefill_attention(causal_pairs(tokens), tokens)


class StepTimeModel:
    """Seconds per step for one model on one GPU, optionally calibrated by measurement."""

    def __init__(self, model: ModelSpec, gpu: GpuSpec, calibration: Calibration | None = None) -> None:
        self.model, self.gpu, self.calibration = model, gpu, calibration
        flops, bandwidth = gpu.peak_flops, gpu.hbm_bandwidth_bytes_per_s
        self.layer = LayerModel(model, gpu)
        # The measured model's, which shapes a calibration's tables past their last points.
        self.measured_layer = self.layer if calibration is None else LayerModel(calibration.model, gpu)
        self.same_shapes = calibration is None or calibration.same_shapes(model)
        self.kv_ratio = 1.0 if calibration is None else self._kv_ratio(calibration)  # (asked per step)
        self.lm_head_per_sequence = 2.0 * model.lm_head_params / (flops * gpu.gemm_flops_efficiency)
        self.lm_head_weights = model.lm_head_params * model.dtype_bytes / (bandwidth * gpu.gemm_bandwidth_efficiency)
        self.kv_per_token = model.kv_bytes_per_token / (bandwidth * gpu.attention_bandwidth_efficiency)
        # Decode reads split by layer kind: full-attention layers every token, sliding ones their window.
        self.window = model.sliding_window or 0
        self.sliding_share = model.num_sliding_layers / model.num_layers
        self.full_kv_per_token = self.kv_per_token * (1.0 - self.sliding_share)
        self.sliding_kv_per_token = self.kv_per_token * self.sliding_share
        self.host_per_token = model.kv_bytes_per_token / gpu.host_bandwidth_bytes_per_s
        self.overhead_s = gpu.step_overhead_s
        self._decode_terms: dict[int, tuple[float, float, tuple[float, ...]]] = {}  # (``decode_step_terms``)
        # A step's terms of its new tokens alone (its layers' and cache writes' seconds), by the tokens: a replay's
        # steps compute a few thousand counts, again and again (``_new_token_terms``)
        self._token_terms: dict[int, tuple[Any, Any]] = {}

    def step_seconds(self, *, new_tokens: Any, sequences: int, prefill_tokens: int = 0, prefill_attended: float = 0,
                     prefill_context: int = 0, decodes: int = 0, decode_context: Any = 0,
                     copied_tokens: int = 0) -> Any:
        """One step's time (or, given arrays for ``decode_context``, one per step of a run of decode steps).

        ``new_tokens``: tokens the step computes (prefill chunks plus one per decode); ``sequences``: sequences in
        the batch (one row of logits each); ``prefill_tokens``: its prefill chunks' tokens, which attend to
        ``prefill_attended`` (query, key) pairs over ``prefill_context`` tokens of K/V; ``decodes``: decoding
        sequences, reading ``decode_context`` tokens of K/V in all; ``copied_tokens``: copy-on-write copies.
        """
        token_terms = self._new_token_terms(new_tokens)
        return (token_terms[0]
                + sequences * self.lm_head_per_sequence + self.lm_head_weights
                + self.prefill_attention_seconds(prefill_tokens, prefill_attended, prefill_context)
                + self.decode_attention_seconds(decodes, decode_context)
                + token_terms[1] + 2 * copied_tokens * self.kv_per_token
                + self.overhead_s)

    def decode_step_terms(self, decodes: int) -> tuple[float, float, tuple[float, ...]] | None:
        """A decode-only step of ``decodes`` sequences reading ``context`` tokens of K/V, as ``step_seconds`` adds
        it up: ``head + context * per_token``, then each of ``tails`` added in turn (the same floats, in the same
        order); None where its time is no such line (a calibration's decode table, a sliding window's share)."""
        if self.sliding_share or (self.calibration is not None and self.calibration.decode_attention is not None):
            return None
        terms = self._decode_terms.get(decodes)
        if terms is None:  # (a replay's bulks ask for a few batch sizes, again and again)
            layers, cache_writes = self._new_token_terms(decodes)
            head = (layers + decodes * self.lm_head_per_sequence + self.lm_head_weights
                    + self.prefill_attention_seconds(0, 0, 0))
            # (after the K/V reads: the cache writes, the copies' term of no copy, the overhead)
            tails = (cache_writes, 2 * 0 * self.kv_per_token, self.overhead_s)
            terms = self._decode_terms[decodes] = (head, self.kv_per_token, tails)
        return terms

    def _new_token_terms(self, tokens: Any) -> tuple[Any, Any]:
        """A step's terms of its new tokens alone, as ``step_seconds`` adds them: its layers' seconds (linear, then
        element-wise) and its cache writes'; kept by the count where it is an int."""
        if type(tokens) is int and (terms := self._token_terms.get(tokens)) is not None:
            return terms
        terms = (self.linear_seconds(tokens) + self.elementwise_seconds(tokens), self.cache_write_seconds(tokens))
        if type(tokens) is int:
            self._token_terms[tokens] = terms
        return terms

    def linear_seconds(self, tokens: Any) -> Any:
        return self._per_token_term("linear", tokens)

    def elementwise_seconds(self, tokens: Any) -> Any:
        """The norms, residual adds, RoPE and activation of every layer on ``tokens`` tokens."""
        return self._per_token_term("elementwise", tokens)

    def _per_token_term(self, name: str, tokens: Any) -> Any:
        """A term of the step's tokens only, ``name`` both a calibration table and a :class:`LayerModel` method:
        the table where the calibration has one (past its last point shaped like the method), else the method;
        per layer, times the layers."""
        efficiency = getattr(self.layer, name)
        table = None if self.calibration is None else getattr(self.calibration, name)
        if table is None:
            return self.model.num_layers * efficiency(tokens)
        measured_efficiency = getattr(self.measured_layer, name)
        measured = table(tokens, shape=measured_efficiency)
        if not self.same_shapes:  # the measured model's efficiency, at this model's size
            measured = measured * efficiency(tokens) / measured_efficiency(tokens)
        return self.model.num_layers * measured

    def prefill_attention_seconds(self, tokens: int, attended: float, context: int) -> Any:
        if not tokens:
            return 0.0
        if self.sliding_share:  # a query of a sliding-window layer attends to at most the window's keys
            attended = (1.0 - self.sliding_share) * attended + self.sliding_share * min(attended, tokens * self.window)
        model, calibration = self.model, self.calibration
        if calibration is None or calibration.prefill_attention is None:
            return model.num_layers * self.layer.prefill_attention(attended, context)
        # The FLOP rate measured on one causal prompt as long as the step's prefill tokens (past the longest
        # measured, that prompt's time grows as the efficiency model's: with the square of its length).
        measured = calibration.model
        rate = causal_pairs(tokens) * measured.attention_flops_per_context_token / measured.num_layers / \
            calibration.prefill_attention(tokens, shape=self.measured_layer.one_prompt)
        return attended * model.attention_flops_per_context_token / rate

    def decode_attention_seconds(self, decodes: int, context: Any) -> Any:
        """``decodes`` sequences reading ``context`` tokens of K/V in all. A sliding-window layer reads
        min(context, decodes * window): each decoder's min(its context, window) summed, exactly, when every
        decoder is past the window or none is (the sum of contexts alone cannot tell the mixed case: there this
        bounds it from above)."""
        if not decodes:
            return 0.0
        calibration = self.calibration
        windowed = _at_most(context, decodes * self.window) if self.sliding_share else 0.0
        if calibration is None or calibration.decode_attention is None:
            if not self.sliding_share:
                return context * self.kv_per_token
            return context * self.full_kv_per_token + windowed * self.sliding_kv_per_token
        per_layer = calibration.decode_attention(decodes, context / decodes)
        if self.sliding_share:
            per_layer = (1.0 - self.sliding_share) * per_layer + \
                self.sliding_share * calibration.decode_attention(decodes, windowed / decodes)
        return self.model.num_layers * per_layer * self.kv_ratio

    def cache_write_seconds(self, tokens: Any) -> Any:
        calibration = self.calibration
        if calibration is None or calibration.cache_write is None:
            return tokens * self.kv_per_token
        return self.model.num_layers * calibration.cache_write(tokens) * self.kv_ratio

    def _kv_ratio(self, calibration: Calibration) -> float:
        """This model's K/V bytes per token and layer over the measured model's."""
        model, measured = self.model, calibration.model
        return (model.kv_bytes_per_token / model.num_layers) / (measured.kv_bytes_per_token / measured.num_layers)

    def swap_seconds(self, tokens: int) -> float:
        """Moving ``tokens`` tokens of K/V between GPU and CPU memory."""
        return tokens * self.host_per_token
