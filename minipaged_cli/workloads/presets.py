"""Model and GPU presets (``configs/``) and the Hugging Face ``config.json`` reader: the shapes that size the KV
cache and the roofline of a step (the model's, and what derives from them, in ``model_spec.py``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from minipaged_cli.errors import InputError, did_you_mean
from minipaged_cli.input_files import read_mapping
from minipaged_cli.validation import MAX_INT32, finite_number, positive_number, whole_number
from minipaged_cli.workloads.model_spec import (
    DTYPE_BYTES,
    FULL_ATTENTION,
    KV_CACHE_DTYPES,
    LAYER_TYPES,
    SLIDING_ATTENTION,
    WEIGHT_QUANTIZATIONS,
    ModelSpec,
    check_experts,
    check_kv_cache_dtype,
    check_layer_types,
    with_kv_cache_dtype,
)

# Callers find the model's types here, beside the presets that fill them.
__all__ = ["CONFIG_DIR", "DEFAULT_EFFICIENCIES", "FULL_ATTENTION", "KV_CACHE_DTYPES", "LAYER_TYPES",
           "SLIDING_ATTENTION", "GpuSpec", "ModelSpec", "check_gpu_fields", "check_kv_cache_dtype", "load_gpu",
           "load_model", "model_from_hf_config", "preset_names", "read_config_file", "with_kv_cache_dtype"]

# An installed wheel carries configs/ inside the package; a source checkout has it beside the package.
_PACKAGE_DIR = Path(__file__).resolve().parent.parent
CONFIG_DIR = next(
    (d for d in (_PACKAGE_DIR / "configs", _PACKAGE_DIR.parent / "configs") if d.is_dir()),
    _PACKAGE_DIR.parent / "configs",
)
# Architectures whose MLP has two matrices (up, down); the rest (Llama, Qwen, Mistral...) gate with three.
_PLAIN_MLP_TYPES = {"opt", "gpt2", "gpt_neox", "gptj", "bloom", "falcon"}
# What transformers' config classes fill in for a model type whose config.json leaves out ``sliding_window`` or
# ``layer_types``: (the window, every how many layers one is full attention, or None: every layer slides), from
# Gemma2Config, Gemma3TextConfig, GptOssConfig, Cohere2Config, MistralConfig, Qwen2Config and Qwen3Config
# (tests/workloads/test_presets_layers.py checks them against those classes).
_HF_SLIDING_DEFAULTS = {"gemma2": (4096, 2), "gemma3": (4096, 6), "gemma3_text": (4096, 6), "gpt_oss": (128, 2),
                        "cohere2": (4096, 4), "mistral": (4096, None), "qwen2": (4096, None), "qwen3": (4096, None)}
# Qwen's windows are off unless ``use_sliding_window`` is true; then Qwen2/3 keep the first ``max_window_layers``
# layers (28 by default) full attention.
_SLIDING_OFF_BY_DEFAULT = {"qwen2", "qwen3", "qwen2_moe", "qwen3_moe"}
_FIRST_LAYERS_FULL = {"qwen2": 28, "qwen3": 28}
# Norms beyond the two of every layer (ModelSpec.norm_params): Gemma 2/3 norm after attention and after the MLP
# too; Qwen3 and Gemma 3 norm each head's q and k (transformers' Qwen3Attention, Gemma3Attention).
_FOUR_NORM_TYPES = {"gemma2", "gemma3", "gemma3_text"}
_QK_NORM_TYPES = {"qwen3", "qwen3_moe", "gemma3", "gemma3_text"}


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
# What vLLM's KV sizing finds on the device besides the weights and activations (sim/kv_sizing.py), for a GPU file
# that does not say: an 8B model's, single GPU, as the presets in configs/gpus/ cite them.
DEFAULT_CUDA_GRAPH_BYTES = 0.7 * 2**30
DEFAULT_NON_TORCH_BYTES = 0.2 * 2**30
DEFAULT_CUDA_CONTEXT_BYTES = 0.5 * 2**30
SIZING_FIELDS = ("total_memory_bytes", "cuda_graph_bytes", "non_torch_bytes", "cuda_context_bytes")


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
    # What vLLM's KV sizing reads (sim/kv_sizing.py): the memory CUDA reports (torch.cuda.mem_get_info's total,
    # less than the datasheet's; None: memory_bytes), the CUDA graphs' pool, what the engine allocates outside
    # torch while profiling (cuBLAS workspaces, NCCL), the CUDA context present before vLLM measures anything.
    total_memory_bytes: float | None = None
    cuda_graph_bytes: float = DEFAULT_CUDA_GRAPH_BYTES
    non_torch_bytes: float = DEFAULT_NON_TORCH_BYTES
    cuda_context_bytes: float = DEFAULT_CUDA_CONTEXT_BYTES
    compute_capability: float = 9.0  # major.minor: which attention backends vLLM can pick (sim/vllm_releases.py)

    def __post_init__(self) -> None:
        check_gpu_fields(vars(self), source=self.name)

    @property
    def reported_memory_bytes(self) -> float:
        """The device's memory as CUDA reports it, what vLLM sizes from."""
        return self.memory_bytes if self.total_memory_bytes is None else self.total_memory_bytes

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
    if fields.get("total_memory_bytes") is not None:
        positive_number(fields["total_memory_bytes"], source=source, field="total_memory_bytes")
    for name in ("cuda_graph_bytes", "non_torch_bytes", "cuda_context_bytes"):
        if name in fields:
            finite_number(fields[name], source=source, field=name, minimum=0.0)
    if "compute_capability" in fields:
        finite_number(fields["compute_capability"], source=source, field="compute_capability", minimum=1.0)

def preset_names(kind: str) -> list[str]:
    """Names of the presets in ``configs/<kind>/`` (kind: 'models' or 'gpus')."""
    return sorted(p.stem for p in (CONFIG_DIR / kind).glob("*.yaml"))


def load_model(name_or_path: str) -> ModelSpec:
    """A preset name (``qwen3-8b``) or a path to a Hugging Face ``config.json`` (or a YAML with its keys)."""
    source, config = _load_config("models", name_or_path, "{model}")
    path = Path(name_or_path)
    if not path.is_file():
        name = name_or_path
    else:
        name = path.resolve().parent.name if path.name == "config.json" else path.stem
    return model_from_hf_config(config, name=name, source=source)


def load_gpu(name_or_path: str) -> GpuSpec:
    source, config = _load_config("gpus", name_or_path, "{gpu}")
    optional = {*LINK_FIELDS, "host_bandwidth_efficiency", *DEFAULT_EFFICIENCIES, *SIZING_FIELDS, "compute_capability"}
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
    """Read the fields of a Hugging Face ``config.json`` (Llama/Qwen/Mistral/OPT/gpt-oss/Gemma 3/DeepSeek naming;
    a multimodal config's ``text_config`` is the decoder's)."""
    if isinstance(config.get("text_config"), dict):
        config = {**config, **config["text_config"]}
    if not isinstance(config.get("model_type", ""), str):
        raise InputError("expected a name", source=source, field="model_type", value=config["model_type"],
                         has_value=True)

    def optional(key: str, *alternatives: str, minimum: int = 1) -> int | None:
        for k in (key, *alternatives):
            if config.get(k) is not None:
                # (at most int32's largest: a shape past a float's range would overflow the sizes derived from it)
                return whole_number(config[k], field=k, source=source, minimum=minimum, maximum=MAX_INT32)
        return None

    def get(key: str, *alternatives: str, default: int | None = None) -> int:
        value = optional(key, *alternatives)
        if value is not None:
            return value
        if default is None:
            raise InputError("missing", source=source, field=key)
        return default

    num_q_heads = get("num_attention_heads")
    hidden_size = get("hidden_size")
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
    if dtype not in DTYPE_BYTES:
        raise InputError(f"expected one of {sorted(DTYPE_BYTES)}", source=source, field="torch_dtype",
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
    experts = {"num_experts": optional("num_local_experts", "num_experts", "n_routed_experts"),
               "num_experts_per_tok": optional("num_experts_per_tok", "experts_per_token"),
               "moe_intermediate_size": optional("moe_intermediate_size"),
               "num_shared_experts": optional("n_shared_experts", minimum=0) or 0,
               "first_k_dense_replace": optional("first_k_dense_replace", minimum=0) or 0}
    check_experts({**experts, "num_layers": num_layers}, source=source)
    try:  # (ModelSpec's own checks name the model; the file is known here)
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
            q_lora_rank=optional("q_lora_rank"),
            qk_nope_head_dim=optional("qk_nope_head_dim"),
            v_head_dim=optional("v_head_dim"),
            **experts,
            weight_quantization=_hf_weight_quantization(config, source),
            norms_per_layer=4 if config.get("model_type") in _FOUR_NORM_TYPES else 2,
            qk_norm=config.get("model_type") in _QK_NORM_TYPES,
        )
    except InputError as error:
        if error.source != name:
            raise
        raise InputError(error.message, source=source, where=error.where, field=error.field, value=error.value,
                         has_value=error.has_value) from None


def _hf_weight_quantization(config: dict[str, Any], source: str) -> str | None:
    """``quantization_config.quant_method`` when it is one whose bytes minipaged counts (WEIGHT_QUANTIZATIONS);
    None (the weights in torch_dtype) when there is none."""
    quantization = config.get("quantization_config")
    if quantization is None:
        return None
    method = quantization.get("quant_method") if isinstance(quantization, dict) else quantization
    if method not in WEIGHT_QUANTIZATIONS:
        raise InputError(f"expected one of {sorted(WEIGHT_QUANTIZATIONS)} (or no quantization_config)",
                         source=source, field="quantization_config.quant_method", value=method, has_value=True)
    return str(method)


def _hf_layer_types(config: dict[str, Any], num_layers: int, source: str) -> tuple[tuple[str, ...], int | None]:
    """Which layers slide, from ``layer_types`` (gpt-oss, Gemma 3, recent transformers), else Qwen2/3's
    ``max_window_layers``, else ``sliding_window_pattern`` (Gemma 3's older configs: every pattern-th layer is
    global), else the model type's default (``_HF_SLIDING_DEFAULTS``), else a ``sliding_window`` on its own
    (Mistral 7B v0.1: every layer). ``use_sliding_window: false`` (Qwen's default) means none slides; so does a
    null window (a choice: transformers keeps the sliding layers, and its model then has no window to mask
    with)."""
    model_type = str(config.get("model_type"))
    window, pattern = _HF_SLIDING_DEFAULTS.get(model_type, (None, None))
    window = config.get("sliding_window", window)
    if config.get("use_sliding_window", model_type not in _SLIDING_OFF_BY_DEFAULT) is False:
        window = None
    if window is not None:
        window = whole_number(window, field="sliding_window", source=source, minimum=1)
    if config.get("layer_types") is not None:  # (then transformers reads no pattern: EXAONE 4 writes "LLLG")
        layer_types = config["layer_types"]
        if not isinstance(layer_types, list) or not all(isinstance(kind, str) for kind in layer_types):
            raise InputError("expected a list of layer type names", source=source, field="layer_types",
                             value=layer_types, has_value=True)
        if not layer_types:
            raise InputError(f"has no entries for {num_layers} layers (num_hidden_layers)", source=source,
                             field="layer_types")
        types = tuple(layer_types)
    elif window is not None and model_type in _FIRST_LAYERS_FULL:
        first = whole_number(config.get("max_window_layers", _FIRST_LAYERS_FULL[model_type]),
                             field="max_window_layers", source=source, minimum=0)
        types = tuple(FULL_ATTENTION if i < first else SLIDING_ATTENTION for i in range(num_layers))
    elif window is not None:
        if "sliding_window_pattern" in config:  # (null too: transformers computes with it and fails)
            pattern = whole_number(config["sliding_window_pattern"], field="sliding_window_pattern",
                                   source=source, minimum=1)
        types = tuple(FULL_ATTENTION if pattern is not None and (i + 1) % pattern == 0 else SLIDING_ATTENTION
                      for i in range(num_layers))
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
    return str(path), read_config_file(path)


def read_config_file(path: Path) -> dict[str, Any]:
    """The keys and values of a config file: JSON by its suffix, else YAML; bad input when it cannot be read, holds
    no mapping or repeats a key."""
    return read_mapping(path, "of keys to values")
