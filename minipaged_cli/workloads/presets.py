"""Model and GPU presets (``configs/``): the shapes that size the KV cache and the roofline of a step."""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from minipaged_cli.errors import InputError, did_you_mean
from minipaged_cli.validation import finite_number, positive_number, whole_number

# An installed wheel carries configs/ inside the package; a source checkout has it beside the package.
_PACKAGE_DIR = Path(__file__).resolve().parent.parent
CONFIG_DIR = next(
    (d for d in (_PACKAGE_DIR / "configs", _PACKAGE_DIR.parent / "configs") if d.is_dir()),
    _PACKAGE_DIR.parent / "configs",
)

_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1, "fp8": 1}
# The KV cache's element type, as vLLM's ``--kv-cache-dtype`` names it: "auto" stores K/V in the model's dtype;
# fp8 stores one byte per element ("fp8" is vLLM's alias of e4m3).
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
FULL_ATTENTION = "full_attention"
SLIDING_ATTENTION = "sliding_attention"
LAYER_TYPES = (FULL_ATTENTION, SLIDING_ATTENTION)
# Architectures whose MLP has two matrices (up, down); the rest (Llama, Qwen, Mistral...) gate with three.
_PLAIN_MLP_TYPES = {"opt", "gpt2", "gpt_neox", "gptj", "bloom", "falcon"}


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

    @property
    def dtype_bytes(self) -> int:
        return _DTYPE_BYTES[self.dtype]

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
    def layer_params(self) -> int:
        """The weight matrices of one layer: Q, K, V and O projections, and the MLP's (norms are negligible)."""
        q_width = self.num_q_heads * self.head_dim
        kv_width = self.num_kv_heads * self.head_dim
        attention = self.hidden_size * (2 * q_width + 2 * kv_width)
        mlp = (3 if self.gated_mlp else 2) * self.hidden_size * self.intermediate_size
        return attention + mlp

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def num_params(self) -> int:
        """Weights: every layer's plus the embeddings (one matrix when the LM head shares it)."""
        embeddings = self.lm_head_params * (1 if self.tie_word_embeddings else 2)
        return self.num_layers * self.layer_params + embeddings

    @property
    def weight_bytes(self) -> int:
        return self.num_params * self.dtype_bytes

    @property
    def attention_flops_per_context_token(self) -> int:
        """FLOPs one query token spends on one cached token: QK^T and PV, a multiply-add each, every layer."""
        return 4 * self.num_layers * self.num_q_heads * self.head_dim


# What real kernels achieve, as fractions of the datasheet's peak FLOP/s and HBM bandwidth. A preset states its
# own, with their sources; these are for a GPU file that does not (the H100's, fitted to measured profiles).
DEFAULT_EFFICIENCIES = {
    "gemm_flops_efficiency": 0.84,
    "gemm_bandwidth_efficiency": 0.90,
    "attention_flops_efficiency": 0.60,
    "attention_bandwidth_efficiency": 0.80,
}
# vLLM's KV offloading blog (quoted in issue 24): ~50 GB/s one way on an H100's PCIe Gen5 x16 (64 GB/s).
DEFAULT_HOST_BANDWIDTH_EFFICIENCY = 0.78
# A PCIe Gen4 NVMe SSD (Samsung 990 PRO datasheet: 7,450 MB/s sequential read, 6,900 MB/s sequential write).
DEFAULT_DISK_READ_BYTES_PER_S = 7.45e9
DEFAULT_DISK_WRITE_BYTES_PER_S = 6.9e9
LINK_FIELDS = ("host_bandwidth_bytes_per_s", "disk_read_bytes_per_s", "disk_write_bytes_per_s")


@dataclass(frozen=True)
class GpuSpec:
    """One GPU: its datasheet peaks and what kernels achieve of them (``sim/step_time.py`` says how a step's time
    is built from these)."""

    name: str
    memory_bytes: float
    hbm_bandwidth_bytes_per_s: float
    peak_flops: float
    step_overhead_s: float
    host_bandwidth_bytes_per_s: float = 64.0e9  # GPU <-> CPU memory, one direction: what swapping costs
    # The share of it host <-> GPU copies of KV blocks achieve (the host tier's link, sim/tiers.py), and the local
    # disk under the host tier (its read and write bandwidth): defaults cited in configs/gpus/h200.yaml.
    host_bandwidth_efficiency: float = DEFAULT_HOST_BANDWIDTH_EFFICIENCY
    disk_read_bytes_per_s: float = DEFAULT_DISK_READ_BYTES_PER_S
    disk_write_bytes_per_s: float = DEFAULT_DISK_WRITE_BYTES_PER_S
    gemm_flops_efficiency: float = DEFAULT_EFFICIENCIES["gemm_flops_efficiency"]
    gemm_bandwidth_efficiency: float = DEFAULT_EFFICIENCIES["gemm_bandwidth_efficiency"]
    attention_flops_efficiency: float = DEFAULT_EFFICIENCIES["attention_flops_efficiency"]
    attention_bandwidth_efficiency: float = DEFAULT_EFFICIENCIES["attention_bandwidth_efficiency"]

    def __post_init__(self) -> None:
        check_gpu_fields(vars(self), source=self.name)

    @property
    def host_link_bytes_per_s(self) -> float:
        """What host <-> GPU copies of KV achieve, one direction."""
        return self.host_bandwidth_bytes_per_s * self.host_bandwidth_efficiency


def check_gpu_fields(fields: dict[str, Any], *, source: str) -> None:
    """A GPU's numbers, from a preset file or a constructor: finite, the peaks positive, the overhead >= 0, the
    efficiencies fractions of a peak."""
    for name in ("memory_bytes", "hbm_bandwidth_bytes_per_s", "peak_flops", *LINK_FIELDS):
        if name in fields:
            positive_number(fields[name], source=source, field=name)
    for name in (*DEFAULT_EFFICIENCIES, "host_bandwidth_efficiency"):
        if name in fields:
            finite_number(fields[name], source=source, field=name, minimum=0.0, exclusive_minimum=True, maximum=1.0)
    if "step_overhead_s" in fields:
        finite_number(fields["step_overhead_s"], source=source, field="step_overhead_s", minimum=0.0)


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


def check_kv_cache_dtype(kv_cache_dtype: str, *, field: str = "--kv-cache-dtype") -> str:
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        hint = did_you_mean(str(kv_cache_dtype), KV_CACHE_DTYPES)
        raise InputError(f"expected one of {', '.join(KV_CACHE_DTYPES)}{hint}", field=field,
                         value=kv_cache_dtype, has_value=True)
    return kv_cache_dtype


def with_kv_cache_dtype(model: ModelSpec, kv_cache_dtype: str) -> ModelSpec:
    """The model with its KV cache stored as ``kv_cache_dtype`` (capacity and bytes moved follow)."""
    return replace(model, kv_cache_dtype=check_kv_cache_dtype(kv_cache_dtype))


def preset_names(kind: str) -> list[str]:
    """Names of the presets in ``configs/<kind>/`` (kind: 'models' or 'gpus')."""
    return sorted(p.stem for p in (CONFIG_DIR / kind).glob("*.yaml"))


def load_model(name_or_path: str) -> ModelSpec:
    """A preset name (``qwen3-8b``) or a path to a Hugging Face ``config.json`` (or a YAML with its keys)."""
    source, config = _load_config("models", name_or_path, "--model")
    path = Path(name_or_path)
    if not path.is_file():
        name = name_or_path
    else:
        name = path.resolve().parent.name if path.name == "config.json" else path.stem
    return model_from_hf_config(config, name=name, source=source)


def load_gpu(name_or_path: str) -> GpuSpec:
    source, config = _load_config("gpus", name_or_path, "--gpu")
    optional = {*LINK_FIELDS, "host_bandwidth_efficiency", *DEFAULT_EFFICIENCIES}
    fields = {"name", "memory_bytes", "hbm_bandwidth_bytes_per_s", "peak_flops", "step_overhead_s"}
    unknown = sorted(set(config) - fields - optional)
    if unknown:
        raise InputError(f"unknown key; expected {sorted(fields | optional)}", source=source, field=unknown[0])
    missing = sorted(fields - set(config))
    if missing:
        raise InputError("missing", source=source, field=missing[0])
    present = (fields | optional) & set(config)
    check_gpu_fields(config, source=source)
    return GpuSpec(**{k: config[k] if k == "name" else float(config[k]) for k in present})


def model_from_hf_config(config: dict[str, Any], *, name: str, source: str) -> ModelSpec:
    """Read the fields of a Hugging Face ``config.json`` (Llama/Qwen/Mistral/OPT naming)."""

    def get(key: str, *alternatives: str, default: int | None = None) -> int:
        for k in (key, *alternatives):
            if k in config:
                return whole_number(config[k], field=k, source=source, minimum=1)
        if default is None:
            raise InputError("missing", source=source, field=key)
        return default

    num_q_heads = get("num_attention_heads")
    hidden_size = get("hidden_size")
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    if dtype not in _DTYPE_BYTES:
        raise InputError(f"expected one of {sorted(_DTYPE_BYTES)}", source=source, field="torch_dtype",
                         value=dtype, has_value=True)
    tie_word_embeddings = config.get("tie_word_embeddings", True)
    if not isinstance(tie_word_embeddings, bool):  # the string "false" would read as true
        raise InputError("must be true or false", source=source, field="tie_word_embeddings",
                         value=tie_word_embeddings, has_value=True)
    num_layers = get("num_hidden_layers")
    layer_types, sliding_window = _hf_layer_types(config, num_layers, source)
    mla = {key: get(key) for key in ("kv_lora_rank", "qk_rope_head_dim") if config.get(key) is not None}
    if len(mla) == 1:
        raise InputError("multi-head latent attention needs both kv_lora_rank and qk_rope_head_dim", source=source,
                         field=next(iter(mla)), value=next(iter(mla.values())), has_value=True)
    return ModelSpec(
        name=name,
        num_layers=num_layers,
        hidden_size=hidden_size,
        intermediate_size=get("intermediate_size", "ffn_dim"),
        num_q_heads=num_q_heads,
        num_kv_heads=get("num_key_value_heads", default=num_q_heads),
        head_dim=get("head_dim", default=hidden_size // num_q_heads),
        vocab_size=get("vocab_size"),
        tie_word_embeddings=tie_word_embeddings,
        gated_mlp=config.get("model_type") not in _PLAIN_MLP_TYPES,
        dtype=dtype,
        max_model_len=get("max_position_embeddings", "max_sequence_length", "seq_length"),
        layer_types=layer_types,
        sliding_window=sliding_window,
        **mla,
    )


def _hf_layer_types(config: dict[str, Any], num_layers: int, source: str) -> tuple[tuple[str, ...], int | None]:
    """Which layers slide, from ``layer_types`` (gpt-oss, Gemma 3, recent transformers), else
    ``sliding_window_pattern`` (Gemma 3's older configs: every pattern-th layer is global), else a
    ``sliding_window`` on its own (Mistral 7B v0.1: every layer). ``use_sliding_window: false`` (Qwen2/3) and a
    null window mean none does."""
    window = config.get("sliding_window")
    if config.get("use_sliding_window") is False:
        window = None
    if window is not None:
        window = whole_number(window, field="sliding_window", source=source, minimum=1)
    if "layer_types" in config:
        layer_types = config["layer_types"]
        if not isinstance(layer_types, list) or not all(isinstance(kind, str) for kind in layer_types):
            raise InputError("expected a list of layer type names", source=source, field="layer_types",
                             value=layer_types, has_value=True)
        types = tuple(layer_types)
    elif window is not None and config.get("sliding_window_pattern") is not None:
        pattern = whole_number(config["sliding_window_pattern"], field="sliding_window_pattern", source=source,
                               minimum=1)
        types = tuple(FULL_ATTENTION if (i + 1) % pattern == 0 else SLIDING_ATTENTION for i in range(num_layers))
    elif window is not None:
        types = (SLIDING_ATTENTION,) * num_layers
    else:
        types = ()
    check_layer_types(types, num_layers, window, source=source)
    if SLIDING_ATTENTION not in types:
        return (), None  # all full attention: the window (if any) is never used
    return types, window


def _load_config(kind: str, name_or_path: str, option: str) -> tuple[str, dict[str, Any]]:
    path = Path(name_or_path)
    if not path.is_file():
        path = CONFIG_DIR / kind / f"{name_or_path}.yaml"
    if not path.is_file() and Path(name_or_path).is_dir():
        raise InputError("is a directory; expected a preset name or a file (a model's config.json)", field=option,
                         value=name_or_path, has_value=True)
    if not path.is_file():
        names = preset_names(kind)
        raise InputError(f"no such preset or file{did_you_mean(name_or_path, names)}; presets: {', '.join(names)}",
                         field=option, value=name_or_path, has_value=True)
    try:
        text = path.read_text()
        config = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (OSError, json.JSONDecodeError, yaml.YAMLError) as error:
        raise InputError(f"cannot read: {str(error).splitlines()[0]}", source=str(path)) from None
    if not isinstance(config, dict):
        raise InputError("expected a mapping of keys to values", source=str(path))
    return str(path), config
