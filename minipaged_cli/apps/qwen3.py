"""Qwen3 through the paged KV cache, built on Hugging Face's modules for everything but attention.

``PagedQwen3`` runs a Hugging Face ``Qwen3ForCausalLM``'s own weights (embeddings, norms, projections, MLPs,
lm_head) and replaces only what attention does with the cache: RoPE (our own, from the config's theta), the
cache write of each new token's K/V through its slot, and decode paged attention through block tables. Every
query, prefill position included, is a decode query over the prefix up to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from minipaged_cli.dataplane.backends import Backend
from minipaged_cli.dataplane.block_tables import append_slots, block_table_tensor
from minipaged_cli.dataplane.kv_cache import PagedKVCache
from minipaged_cli.dataplane.kv_scales import DEFAULT_SCALE_MODE
from minipaged_cli.errors import InputError
from minipaged_cli.memory.block_manager import KVBlockManager
from minipaged_cli.validation import whole_number
from minipaged_cli.workloads.presets import CONFIG_DIR, read_config_file

VERIFY_CONFIG_DIR = CONFIG_DIR / "verify"
DEFAULT_VERIFY_CONFIG = "qwen3-0.6b-4-layers"


def load_config_file(name_or_path: str) -> dict[str, Any]:
    """A Qwen3 config (Hugging Face keys) from ``configs/verify/<name>.yaml`` or a YAML/JSON path, checked the way
    the paged model will use it: Hugging Face builds a Qwen3 from it (on the meta device: shapes, no memory), every
    layer is full attention, and the query heads split evenly over the KV heads."""
    path = Path(name_or_path)
    if not path.is_file():
        path = VERIFY_CONFIG_DIR / f"{name_or_path}.yaml"
    if not path.is_file():
        names = sorted(p.stem for p in VERIFY_CONFIG_DIR.glob("*.yaml"))
        raise InputError(f"no such config; configs/verify has {', '.join(names)}", field="{model_config}",
                         value=name_or_path, has_value=True)
    source, config = str(path), read_config_file(path)
    if config.get("model_type", "qwen3") != "qwen3":
        raise InputError("not a Qwen3 config: verify checks Qwen3's attention", source=source, field="model_type",
                         value=config["model_type"], has_value=True)
    try:
        checked = qwen3_on_meta(config).config
        theta = rope_theta(checked)
    except ImportError:  # (a missing extra, which the command names)
        raise
    except Exception as error:  # (transformers' checks raise ValueErrors, TypeErrors, KeyErrors, its hub's own)
        lines = str(error).strip().splitlines()  # (the last says what; a hub error's first names the class)
        raise InputError(f"Hugging Face cannot build a Qwen3 from it: {type(error).__name__}: "
                         f"{lines[-1].strip() if lines else ''}",
                         source=source) from None
    if "sliding_attention" in (checked.layer_types or ()):
        raise InputError("verify checks full attention; this config has sliding-window layers", source=source,
                         field="layer_types")
    head_dim = whole_number(checked.head_dim, field="head_dim", source=source, minimum=1)
    for field in ("num_attention_heads", "num_key_value_heads"):
        whole_number(getattr(checked, field), field=field, source=source, minimum=1)
    if checked.num_attention_heads % checked.num_key_value_heads:
        raise InputError(f"num_attention_heads {checked.num_attention_heads} is not a multiple of it", source=source,
                         field="num_key_value_heads", value=checked.num_key_value_heads, has_value=True)
    if head_dim % 2 or not theta > 0:
        field, value = ("head_dim", head_dim) if head_dim % 2 else ("rope_theta", theta)
        raise InputError("RoPE needs an even head_dim and a positive theta", source=source, field=field, value=value,
                         has_value=True)
    return config


def qwen3_on_meta(config: dict[str, Any]) -> Any:
    """Hugging Face's Qwen3 of ``config`` on the meta device: its shapes and parameter count, no memory."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    with torch.device("meta"):
        return Qwen3ForCausalLM(Qwen3Config(**config, attn_implementation="eager"))


def build_random_qwen3(config: dict[str, Any], seed: int, dtype: torch.dtype, device: torch.device) -> Any:
    """A Qwen3 with seeded random weights (Hugging Face's initialisation), eager attention, in eval mode; refused
    (bad input) when its weights would not fit: built in float32 (Hugging Face's default) in the host's memory,
    then moved and cast a parameter at a time to ``device``."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    num_params = sum(p.numel() for p in qwen3_on_meta(config).parameters())
    needs = [(torch.device("cpu"), num_params * 4)]
    if device.type != "cpu":
        needs.append((device, num_params * dtype.itemsize))
    for where, need in needs:
        free = free_memory_bytes(where)
        if free is not None and need > 0.8 * free:
            raise InputError(f"random weights of {num_params / 1e9:.2f} B parameters need {need / 2**30:.1f} GiB "
                             f"on {where.type}, more than 80 % of its {free / 2**30:.1f} GiB free: use a smaller "
                             "config (configs/verify has two)", field="{model_config}")
    torch.manual_seed(seed)
    model = Qwen3ForCausalLM(Qwen3Config(**config, attn_implementation="eager"))
    return model.to(device=device, dtype=dtype).eval()


def free_memory_bytes(device: torch.device) -> int | None:
    """Memory free for new tensors on ``device`` (the host's MemAvailable for the CPU); None where unknown."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as meminfo:
            fields = dict(line.split(":", 1) for line in meminfo)
        return int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def load_qwen3(model_path: Path, dtype: torch.dtype, device: torch.device) -> Any:
    """A local Hugging Face checkpoint: config.json + *.safetensors. Pickle weights are refused; nothing is
    downloaded."""
    if not (model_path / "config.json").is_file():
        raise InputError("no config.json in the directory", field="{model_path}", value=str(model_path),
                         has_value=True)
    if not list(model_path.glob("*.safetensors")):
        pickled = [p.name for p in model_path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".pkl")]
        reason = f"only pickle weights ({', '.join(pickled)}), which are refused" if pickled else "no *.safetensors"
        raise InputError(reason, field="{model_path}", value=str(model_path), has_value=True)
    from transformers import AutoConfig, Qwen3ForCausalLM

    config = AutoConfig.from_pretrained(model_path, local_files_only=True)
    if config.model_type != "qwen3":
        raise InputError("not a Qwen3 checkpoint", source=str(model_path / "config.json"), field="model_type",
                         value=config.model_type, has_value=True)
    model = Qwen3ForCausalLM.from_pretrained(model_path, local_files_only=True, use_safetensors=True,
                                             attn_implementation="eager", dtype=dtype)
    return model.to(device).eval()


def rope_theta(config: Any) -> float:
    """RoPE base from a Qwen3 config (``rope_parameters`` in transformers 5, ``rope_theta`` before)."""
    parameters = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None) or {}
    rope_type = parameters.get("rope_type", "default")
    if rope_type != "default":
        raise InputError("only the default RoPE is supported", field="rope_type", value=rope_type, has_value=True)
    return float(parameters.get("rope_theta", getattr(config, "rope_theta", 10000.0)))


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotary embedding of x [tokens, heads, head_dim] at ``positions`` [tokens], computed in fp32.

    Qwen3 (like Llama) rotates the two halves of head_dim: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin) with
    angle position * theta^(-2i / head_dim) for i < head_dim / 2.
    """
    head_dim = x.shape[-1]
    inverse_frequency = theta ** (-torch.arange(0, head_dim, 2, device=x.device, dtype=torch.float32) / head_dim)
    angles = positions.to(torch.float32)[:, None] * inverse_frequency[None, :]  # [tokens, head_dim / 2]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x.float()[..., : head_dim // 2], x.float()[..., head_dim // 2:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).to(x.dtype)


@dataclass
class LayerAttention:
    """One Qwen3 attention layer's weights used outside Hugging Face's forward."""

    module: Any  # transformers' Qwen3Attention
    theta: float

    @property
    def num_q_heads(self) -> int:
        return self.module.q_proj.out_features // self.module.head_dim

    @property
    def num_kv_heads(self) -> int:
        return self.module.k_proj.out_features // self.module.head_dim

    def qkv(self, hidden: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """hidden [tokens, hidden_size] (after input_layernorm) -> q [tokens, q heads, head_dim], k, v [tokens,
        kv heads, head_dim]: projections, per-head RMSNorm of q and k, RoPE of q and k."""
        module, head_dim = self.module, self.module.head_dim
        q = module.q_norm(module.q_proj(hidden).view(len(hidden), -1, head_dim))
        k = module.k_norm(module.k_proj(hidden).view(len(hidden), -1, head_dim))
        v = module.v_proj(hidden).view(len(hidden), -1, head_dim)
        return apply_rope(q, positions, self.theta), apply_rope(k, positions, self.theta), v

    def output(self, attention: torch.Tensor) -> torch.Tensor:
        """attention [tokens, q heads, head_dim] -> o_proj -> [tokens, hidden_size]."""
        return self.module.o_proj(attention.reshape(len(attention), -1))


class PagedAttentionState:
    """The block manager and the cache of some layers, with blocks deliberately scrambled. ``cache_dtype``: the
    cache's element type when it is not the model's ``dtype`` (fp8, with ``scale_mode``: dataplane/fp8.py)."""

    def __init__(self, num_layers: int, num_blocks: int, num_kv_heads: int, block_size: int, head_dim: int,
                 dtype: torch.dtype, backend: Backend, seed: int, cache_dtype: torch.dtype | None = None,
                 scale_mode: str = DEFAULT_SCALE_MODE) -> None:
        self.manager = KVBlockManager(num_blocks, block_size)
        self.cache = PagedKVCache(num_layers, num_blocks, num_kv_heads, block_size, head_dim, cache_dtype or dtype,
                                  backend.device, scale_mode)
        self.backend = backend
        scramble_free_blocks(self.manager, seed)

    def write(self, layer: int, key: torch.Tensor, value: torch.Tensor, slots: list[int]) -> None:
        slot_mapping = torch.tensor(slots, dtype=torch.int64, device=self.backend.device)
        self.backend.cache_write(key, value, self.cache.key_cache[layer], self.cache.value_cache[layer],
                                 slot_mapping, *self.cache.scales_for_write(layer, key, value))

    def attend(self, layer: int, query: torch.Tensor, sequence_ids: list[int], seq_lens: list[int],
               scale: float) -> torch.Tensor:
        """Decode attention of query [n, q heads, head_dim]: row i attends to the first seq_lens[i] positions
        of sequence_ids[i]."""
        device = self.backend.device
        block_tables = block_table_tensor(self.manager, sequence_ids, as_torch=True).to(device)
        lens = torch.tensor(seq_lens, dtype=torch.int32, device=device)
        return self.backend.paged_attention(query, self.cache.key_cache[layer], self.cache.value_cache[layer],
                                            block_tables, lens, scale, *self.cache.scales(layer))


def scramble_free_blocks(manager: KVBlockManager, seed: int) -> None:
    """Allocate every block to one-block decoy sequences, then free them in a seeded random order: the free
    queue becomes a random permutation, so no sequence allocated afterwards gets contiguous or ordered blocks."""
    generator = torch.Generator().manual_seed(seed)
    decoys = [("decoy", i) for i in range(manager.num_free_blocks)]
    for decoy in decoys:
        manager.create_sequence(decoy)
        manager.grow(decoy, 1)
    for index in torch.randperm(len(decoys), generator=generator).tolist():
        manager.release_sequence(decoys[index])


class PagedQwen3:
    """A Hugging Face Qwen3 whose every attention layer reads and writes the paged cache: greedy generation."""

    def __init__(self, model: Any, backend: Backend, block_size: int, num_blocks: int, seed: int,
                 cache_dtype: torch.dtype | None = None, scale_mode: str = DEFAULT_SCALE_MODE) -> None:
        self.model = model
        config = model.config
        theta = rope_theta(config)
        self.layers = [LayerAttention(layer.self_attn, theta) for layer in model.model.layers]
        attention = self.layers[0]
        self.state = PagedAttentionState(len(self.layers), num_blocks, attention.num_kv_heads, block_size,
                                         attention.module.head_dim, next(model.parameters()).dtype, backend, seed,
                                         cache_dtype, scale_mode)
        self.lengths: dict[int, int] = {}

    @torch.no_grad()
    def step(self, tokens: dict[int, list[int]]) -> dict[int, torch.Tensor]:
        """Feed new tokens to sequences (a whole prompt, or one token); returns each sequence's last logits."""
        manager = self.state.manager
        rows: list[tuple[int, int]] = []  # (sequence, position) of every new token, in order
        slots: list[int] = []
        for sequence, new_tokens in tokens.items():
            if sequence not in self.lengths:
                manager.create_sequence(sequence)
                self.lengths[sequence] = 0
            start = self.lengths[sequence]
            slots.extend(append_slots(manager, sequence, len(new_tokens)))
            rows.extend((sequence, start + i) for i in range(len(new_tokens)))
            self.lengths[sequence] += len(new_tokens)
        device = self.state.backend.device
        ids = torch.tensor([t for new_tokens in tokens.values() for t in new_tokens], device=device)
        positions = torch.tensor([p for _, p in rows], device=device)
        hidden = self.model.model.embed_tokens(ids)  # [new tokens, hidden_size]
        for index, (decoder, attention) in enumerate(zip(self.model.model.layers, self.layers, strict=True)):
            q, k, v = attention.qkv(decoder.input_layernorm(hidden), positions)
            self.state.write(index, k, v, slots)
            out = self.state.attend(index, q, [s for s, _ in rows], [p + 1 for _, p in rows],
                                    attention.module.scaling)
            hidden = hidden + attention.output(out)
            hidden = hidden + decoder.mlp(decoder.post_attention_layernorm(hidden))
        logits = self.model.lm_head(self.model.model.norm(hidden))  # [new tokens, vocab]
        last = {}
        for row, (sequence, _) in enumerate(rows):
            last[sequence] = logits[row]  # the sequence's last new token wins
        return last
