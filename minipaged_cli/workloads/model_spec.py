"""A decoder-only transformer's shapes (``ModelSpec``) and everything derived from them: KV bytes per token for
full, sliding-window and latent attention in the KV cache's dtype; the weights of dense, MoE and MLA layers, in
total, per token and in their stored formats; the FLOPs of attention. ``presets.py`` fills it from a preset or a
Hugging Face ``config.json``."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from minipaged_cli.errors import InputError, did_you_mean
from minipaged_cli.validation import whole_number

DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "fp8": 1}
# The KV cache's element type, as vLLM's ``--kv-cache-dtype`` names it: "auto" stores K/V in the model's dtype;
# fp8 stores one byte per element ("fp8" is vLLM's alias of e4m3).
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
LAYER_TYPES = (FULL_ATTENTION, SLIDING_ATTENTION)
# How a checkpoint stores its weights, Hugging Face's ``quantization_config.quant_method``: "mxfp4" (gpt-oss) keeps
# its routed experts in OCP MX FP4, 32 4-bit elements sharing one 8-bit scale = 4.25 bits a weight (attention,
# routers, embeddings stay in the model's dtype: its modules_to_not_convert); "fp8" (DeepSeek-V3) keeps every
# layer's linear weights in one byte (its 128 x 128 blocks' fp32 scales are 1/4096 byte a weight, left out).
WEIGHT_QUANTIZATIONS = {"mxfp4": 17 / 32, "fp8": 1}


@dataclass(frozen=True)
class ModelSpec:
    """The shapes of a decoder-only transformer that the simulator needs."""

    name: str
    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool
    gated_mlp: bool
    dtype: str
    max_model_len: int
    # Per layer, FULL_ATTENTION or SLIDING_ATTENTION (Hugging Face's ``layer_types``); () means all full.
    layer_types: tuple[str, ...] = ()
    sliding_window: int | None = None  # tokens a sliding-window layer attends to (and must keep)
    # Multi-head latent attention (DeepSeek-V2/V3): a layer caches one latent vector of kv_lora_rank +
    # qk_rope_head_dim elements per token, shared by all heads, instead of per-head K and V.
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    kv_cache_dtype: str = "auto"  # KV_CACHE_DTYPES; with_kv_cache_dtype sets it
    # MLA's projections: Q through a rank-q_lora_rank bottleneck (None: one matrix), qk_nope_head_dim +
    # qk_rope_head_dim per head for QK, v_head_dim for V (None: head_dim).
    q_lora_rank: int | None = None
    qk_nope_head_dim: int | None = None
    v_head_dim: int | None = None
    # Mixture of experts: each MoE layer sends a token to num_experts_per_tok of its num_experts routed experts
    # (gated MLPs of moe_intermediate_size) and to its num_shared_experts; the first first_k_dense_replace layers
    # keep a dense MLP of intermediate_size (DeepSeek). num_experts None: a dense model.
    num_experts: int | None = None
    num_experts_per_tok: int | None = None
    moe_intermediate_size: int | None = None
    num_shared_experts: int = 0
    first_k_dense_replace: int = 0
    weight_quantization: str | None = None  # a WEIGHT_QUANTIZATIONS key; None: every weight in dtype
    # The small tensors that memory counts and a step's time can neglect (``norm_params``): norms per layer (2:
    # before attention and before the MLP; Gemma 2/3's 4 add one after each), Qwen3's and Gemma 3's per-head
    # RMSNorm on q and k, and the LayerNorm family's (OPT, GPT-2: ``gated_mlp`` False) biases.
    norms_per_layer: int = 2
    qk_norm: bool = False

    def __post_init__(self) -> None:
        for name in ("num_layers", "hidden_size", "intermediate_size", "num_q_heads", "num_kv_heads",
                     "head_dim", "vocab_size", "max_model_len"):
            whole_number(getattr(self, name), field=name, source=self.name, minimum=1)
        if self.num_q_heads % self.num_kv_heads:
            raise InputError(f"num_attention_heads {self.num_q_heads} is not a multiple of it",
                             source=self.name, field="num_key_value_heads", value=self.num_kv_heads,
                             has_value=True)
        check_layer_types(self.layer_types, self.num_layers, self.sliding_window, source=self.name)
        if (self.kv_lora_rank is None) != (self.qk_rope_head_dim is None):
            raise InputError("multi-head latent attention needs both kv_lora_rank and qk_rope_head_dim",
                             source=self.name, field="kv_lora_rank", value=self.kv_lora_rank, has_value=True)
        for name in ("kv_lora_rank", "qk_rope_head_dim"):
            if getattr(self, name) is not None:
                whole_number(getattr(self, name), field=name, source=self.name, minimum=1)
        check_kv_cache_dtype(self.kv_cache_dtype)
        for name in ("q_lora_rank", "qk_nope_head_dim", "v_head_dim"):
            if getattr(self, name) is not None:
                whole_number(getattr(self, name), field=name, source=self.name, minimum=1)
        check_experts(vars(self), source=self.name)
        if self.weight_quantization is not None and self.weight_quantization not in WEIGHT_QUANTIZATIONS:
            raise InputError(f"expected one of {sorted(WEIGHT_QUANTIZATIONS)}", source=self.name,
                             field="quantization_config.quant_method", value=self.weight_quantization,
                             has_value=True)

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.dtype]

    @property
    def kv_dtype_bytes(self) -> int:
        """Bytes of one cached K/V element: the model's dtype, or 1 with an fp8 cache."""
        return self.dtype_bytes if self.kv_cache_dtype == "auto" else 1

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank is not None

    @property
    def kv_bytes_per_token_per_layer(self) -> int:
        """What one layer caches per token: K and V, kv_heads * head_dim elements each, or (MLA) one latent
        vector of kv_lora_rank + qk_rope_head_dim elements."""
        if self.kv_lora_rank is not None and self.qk_rope_head_dim is not None:
            return (self.kv_lora_rank + self.qk_rope_head_dim) * self.kv_dtype_bytes
        return 2 * self.num_kv_heads * self.head_dim * self.kv_dtype_bytes

    @property
    def kv_bytes_per_token(self) -> int:
        """Every layer's per-token KV: what a token costs while every layer keeps it (all of a full-attention
        model's life; a sliding-window layer drops tokens that leave its window, ``memory/`` says when)."""
        return self.num_layers * self.kv_bytes_per_token_per_layer

    @property
    def layer_kinds(self) -> tuple[str, ...]:
        """Each layer's attention type (FULL_ATTENTION for every layer of a model without ``layer_types``)."""
        return self.layer_types or (FULL_ATTENTION,) * self.num_layers

    @property
    def num_sliding_layers(self) -> int:
        return self.layer_types.count(SLIDING_ATTENTION)

    @property
    def is_hybrid(self) -> bool:
        """Some layers keep only a window of tokens."""
        return self.num_sliding_layers > 0

    @property
    def is_moe(self) -> bool:
        return self.num_experts is not None

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.first_k_dense_replace if self.is_moe else 0

    @property
    def qk_head_dim(self) -> int:
        """Elements per head that a query dots with a key: MLA's no-position and rotary parts, else head_dim."""
        if self.qk_rope_head_dim is None:
            return self.head_dim
        return (self.qk_nope_head_dim or self.head_dim) + self.qk_rope_head_dim

    @property
    def attention_params(self) -> int:
        """One layer's attention weights: Q, K, V and O projections; MLA's Q (through its low rank), the joint
        K/V down-projection to the latent and the rotary key, the latent's up-projection to per-head K and V, O."""
        hidden, heads = self.hidden_size, self.num_q_heads
        if self.kv_lora_rank is None or self.qk_rope_head_dim is None:
            q_width, kv_width = heads * self.head_dim, self.num_kv_heads * self.head_dim
            return hidden * (2 * q_width + 2 * kv_width)
        v_head_dim, nope = self.v_head_dim or self.head_dim, self.qk_nope_head_dim or self.head_dim
        q_width = heads * self.qk_head_dim
        q = hidden * q_width if self.q_lora_rank is None else self.q_lora_rank * (hidden + q_width)
        kv = hidden * (self.kv_lora_rank + self.qk_rope_head_dim) + self.kv_lora_rank * heads * (nope + v_head_dim)
        return q + kv + heads * v_head_dim * hidden

    def _mlp_params(self, intermediate_size: int) -> int:
        return (3 if self.gated_mlp else 2) * self.hidden_size * intermediate_size

    @property
    def expert_params(self) -> int:
        """One expert's weights (routed or shared)."""
        return self._mlp_params(self.moe_intermediate_size or self.intermediate_size)

    @property
    def routed_expert_params(self) -> int:
        """Every routed expert of every MoE layer: the weights a step reads only where its tokens go."""
        return self.num_moe_layers * (self.num_experts or 0) * self.expert_params

    def _layers_params(self, experts: int) -> int:
        """Every layer's weights when ``experts`` routed experts of each MoE layer count (norms are negligible)."""
        dense = self.num_layers - self.num_moe_layers
        moe = self.num_moe_layers * ((experts + self.num_shared_experts) * self.expert_params
                                     + self.hidden_size * (self.num_experts or 0))  # + the router
        return self.num_layers * self.attention_params + dense * self._mlp_params(self.intermediate_size) + moe

    @property
    def layers_params(self) -> int:
        """The weights of all layers, every expert included."""
        return self._layers_params(self.num_experts or 0)

    @property
    def active_layers_params(self) -> int:
        """The layers' weights one token computes with: its num_experts_per_tok routed experts, not the rest."""
        return self._layers_params(self.num_experts_per_tok or 0)

    @property
    def active_intermediate_size(self) -> float:
        """The MLP width one token computes in a layer, averaged over the layers: intermediate_size in a dense
        layer, moe_intermediate_size for each of its routed and shared experts in a MoE layer."""
        if not self.is_moe:
            return self.intermediate_size
        moe_width = ((self.num_experts_per_tok or 0) + self.num_shared_experts) * \
            (self.moe_intermediate_size or self.intermediate_size)
        dense = self.num_layers - self.num_moe_layers
        return (dense * self.intermediate_size + self.num_moe_layers * moe_width) / self.num_layers

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def embedding_params(self) -> int:
        """The input embedding and the LM head (one matrix when they are tied)."""
        return self.lm_head_params * (1 if self.tie_word_embeddings else 2)

    @property
    def num_params(self) -> int:
        """Weights: every layer's, every expert's, plus the embeddings: what sizes memory."""
        return self.layers_params + self.embedding_params

    @property
    def num_active_params(self) -> int:
        """Weights one token uses: ``num_params`` less the routed experts it is not sent to (the embeddings
        counted, as DeepSeek's and Qwen's model cards count their "activated" parameters)."""
        return self.active_layers_params + self.embedding_params

    @property
    def expert_weight_bytes(self) -> float:
        """Bytes of one weight of a routed expert."""
        if self.weight_quantization is None:
            return self.dtype_bytes
        return WEIGHT_QUANTIZATIONS[self.weight_quantization]

    @property
    def layer_weight_bytes(self) -> float:
        """Bytes of one weight of attention, dense and shared MLPs, routers (fp8 checkpoints store them in one
        byte; mxfp4 only its experts)."""
        return 1 if self.weight_quantization == "fp8" else self.dtype_bytes

    @property
    def read_weight_bytes(self) -> float:
        """The layers' weights every step reads whatever its tokens' routing: all of them but routed experts."""
        return (self.layers_params - self.routed_expert_params) * self.layer_weight_bytes

    @property
    def norm_params(self) -> int:
        """The weights ``num_params`` leaves out, every one of them a vector: the layers' norms and the final
        one, the per-head q/k norms, MLA's norms of its low-rank latents; for the LayerNorm family (no gated MLP:
        OPT, GPT-2), each norm's bias and every linear layer's (q, k, v, o, the MLP's two). Other models' few
        biases (Qwen2's q/k/v, gpt-oss's) and learned position tables stay left out: under 0.1 % of any preset."""
        hidden = self.hidden_size
        per_layer = self.norms_per_layer * hidden + (2 * self.qk_head_dim if self.qk_norm else 0)
        per_layer += (self.q_lora_rank or 0) + (self.kv_lora_rank or 0)
        final = hidden
        if not self.gated_mlp:  # LayerNorm: a bias beside each weight; linear layers with biases
            per_layer, final = 2 * per_layer, 2 * final
            per_layer += self.num_q_heads * self.head_dim + 2 * self.num_kv_heads * self.head_dim + hidden
            per_layer += self.intermediate_size + hidden
        return self.num_layers * per_layer + final

    @property
    def weight_bytes(self) -> float:
        """Memory the weights take, in their stored formats (``WEIGHT_QUANTIZATIONS``): every tensor, norms
        included (kept in the model's dtype, as vLLM loads them)."""
        return (self.read_weight_bytes + self.routed_expert_params * self.expert_weight_bytes
                + (self.embedding_params + self.norm_params) * self.dtype_bytes)

    @property
    def attention_flops_per_context_token(self) -> int:
        """FLOPs one query token spends on one cached token, every layer: a multiply-add per element of QK^T
        and of PV. MLA as vLLM runs its decode (weights absorbed): every head dots its query with the whole
        latent (kv_lora_rank + qk_rope_head_dim) and sums latents (kv_lora_rank), not head_dim each."""
        if self.kv_lora_rank is not None and self.qk_rope_head_dim is not None:
            per_head = 2 * self.kv_lora_rank + self.qk_rope_head_dim
        else:
            per_head = 2 * self.head_dim
        return 2 * self.num_layers * self.num_q_heads * per_head


def check_layer_types(layer_types: tuple[str, ...], num_layers: int, sliding_window: int | None, *,
                      source: str) -> None:
    """One known type per layer, and a window of at least one token when any layer slides."""
    if not layer_types:
        return
    if len(layer_types) != num_layers:
        raise InputError(f"has {len(layer_types)} entries for {num_layers} layers (num_hidden_layers)",
                         source=source, field="layer_types")
    unknown = sorted(set(layer_types) - set(LAYER_TYPES))
    if unknown:
        raise InputError(f"expected each of {list(LAYER_TYPES)}", source=source, field="layer_types",
                         value=unknown[0], has_value=True)
    if SLIDING_ATTENTION in layer_types:
        if sliding_window is None:
            raise InputError("missing: layer_types has sliding_attention layers", source=source,
                             field="sliding_window")
        whole_number(sliding_window, field="sliding_window", source=source, minimum=1)


def check_experts(fields: dict[str, Any], *, source: str) -> None:
    """A MoE model's fields (``ModelSpec``'s names): it names its experts, routes each token to at least one and
    at most all of them, and keeps at least one MoE layer after its dense ones."""
    num_experts, per_token = fields.get("num_experts"), fields.get("num_experts_per_tok")
    if num_experts is None:
        if per_token is not None:
            raise InputError("needs num_experts (num_local_experts, n_routed_experts)", source=source,
                             field="num_experts_per_tok", value=per_token, has_value=True)
        return
    whole_number(num_experts, field="num_experts", source=source, minimum=1)
    if per_token is None:
        raise InputError("missing: the model has routed experts", source=source, field="num_experts_per_tok")
    whole_number(per_token, field="num_experts_per_tok", source=source, minimum=1, maximum=num_experts)
    if fields.get("moe_intermediate_size") is not None:
        whole_number(fields["moe_intermediate_size"], field="moe_intermediate_size", source=source, minimum=1)
    whole_number(fields.get("num_shared_experts", 0), field="n_shared_experts", source=source, minimum=0)
    whole_number(fields.get("first_k_dense_replace", 0), field="first_k_dense_replace", source=source, minimum=0,
                 maximum=fields["num_layers"] - 1)


def check_kv_cache_dtype(kv_cache_dtype: str, *, field: str = "{kv_cache_dtype}") -> str:
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        hint = did_you_mean(str(kv_cache_dtype), KV_CACHE_DTYPES)
        raise InputError(f"expected one of {', '.join(KV_CACHE_DTYPES)}{hint}", field=field,
                         value=kv_cache_dtype, has_value=True)
    return kv_cache_dtype


def with_kv_cache_dtype(model: ModelSpec, kv_cache_dtype: str) -> ModelSpec:
    """The model with its KV cache stored as ``kv_cache_dtype`` (capacity and bytes moved follow)."""
    return replace(model, kv_cache_dtype=check_kv_cache_dtype(kv_cache_dtype))
