"""Model and GPU presets against published figures, and Hugging Face config.json files."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from minipaged_cli.errors import InputError
from minipaged_cli.units import format_bytes, parse_bytes
from minipaged_cli.workloads.presets import load_gpu, load_model, preset_names


@pytest.mark.parametrize(("name", "kv_bytes", "params_billion"), [
    # 2 (K, V) * layers * kv heads * head_dim * 2 bytes; parameter counts from the model cards
    ("qwen3-8b", 2 * 36 * 8 * 128 * 2, 8.2),
    ("qwen3-0.6b", 2 * 28 * 8 * 128 * 2, 0.6),
    ("opt-13b", 800 * 1024, 13.0),  # the vLLM paper: 800 KiB of KV per token
])
def test_model_presets(name: str, kv_bytes: int, params_billion: float) -> None:
    model = load_model(name)
    assert model.kv_bytes_per_token == kv_bytes
    assert model.num_params / 1e9 == pytest.approx(params_billion, rel=0.05)


def test_gpu_presets() -> None:
    assert preset_names("gpus") == ["a100-40gb", "a100-80gb", "h100", "h200"]
    h200 = load_gpu("h200")
    assert (h200.hbm_bandwidth_bytes_per_s, h200.peak_flops) == (4.8e12, 989e12)


def test_hugging_face_config_json(tmp_path: Path) -> None:
    # The fields of Qwen/Qwen3-0.6B's config.json that matter here (others are ignored).
    config = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_size": 1024,
              "intermediate_size": 3072, "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128,
              "num_hidden_layers": 28, "vocab_size": 151936, "tie_word_embeddings": True, "torch_dtype": "bfloat16",
              "max_position_embeddings": 40960, "rope_theta": 1000000, "rms_norm_eps": 1e-6}
    directory = tmp_path / "Qwen3-0.6B"
    directory.mkdir()
    (directory / "config.json").write_text(json.dumps(config))
    model = load_model(str(directory / "config.json"))
    assert model.name == "Qwen3-0.6B"
    assert model == dataclasses.replace(load_model("qwen3-0.6b"), name="Qwen3-0.6B")


def test_llama_style_config_defaults_kv_heads_and_head_dim(tmp_path: Path) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 4096, "intermediate_size": 11008, "num_attention_heads": 32,
                                "num_hidden_layers": 32, "vocab_size": 32000, "max_position_embeddings": 4096,
                                "torch_dtype": "float16"}))
    model = load_model(str(path))
    assert (model.num_kv_heads, model.head_dim) == (32, 128)
    assert model.kv_bytes_per_token == 2 * 32 * 32 * 128 * 2  # Llama-2-7B: 512 KiB per token


@pytest.mark.parametrize(("content", "message"), [
    ({"hidden_size": 8}, "missing"),
    ({"hidden_size": 8, "intermediate_size": 8, "num_attention_heads": "4", "num_hidden_layers": 1,
      "vocab_size": 8, "max_position_embeddings": 8}, "num_attention_heads: '4': must be a whole number"),
    ({"hidden_size": 8, "intermediate_size": 8, "num_attention_heads": 4, "num_hidden_layers": 1.5,
      "vocab_size": 8, "max_position_embeddings": 8}, "num_hidden_layers: 1.5: must be a whole number"),
    ({"hidden_size": 8, "intermediate_size": 8, "num_attention_heads": 4, "num_hidden_layers": 1,
      "vocab_size": 8, "max_position_embeddings": 0}, "max_position_embeddings: 0: must be >= 1"),
    # json.loads reads Infinity; a context length of infinity is no length
    ({"hidden_size": 8, "intermediate_size": 8, "num_attention_heads": 4, "num_hidden_layers": 1,
      "vocab_size": 8, "max_position_embeddings": float("inf")}, "max_position_embeddings: inf"),
    # bool("false") is True: the string must not silently tie the embeddings
    ({"hidden_size": 8, "intermediate_size": 8, "num_attention_heads": 4, "num_hidden_layers": 1,
      "vocab_size": 8, "max_position_embeddings": 8, "tie_word_embeddings": "false"},
     "tie_word_embeddings: 'false': must be true or false"),
    ({"hidden_size": 8, "intermediate_size": 8, "num_attention_heads": 4, "num_key_value_heads": 3,
      "num_hidden_layers": 1, "vocab_size": 8, "max_position_embeddings": 8}, "not a multiple"),
])
def test_bad_config_names_the_field(tmp_path: Path, content: dict, message: str) -> None:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(content))
    with pytest.raises(InputError, match=message):
        load_model(str(path))


def test_whole_float_counts_are_read_as_integers(tmp_path: Path) -> None:
    # A config written by a tool that emits floats: 4096.0 is the whole number 4096.
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"hidden_size": 4096.0, "intermediate_size": 11008, "num_attention_heads": 32,
                                "num_hidden_layers": 32.0, "vocab_size": 32000, "max_position_embeddings": 4096}))
    model = load_model(str(path))
    assert (model.hidden_size, model.num_layers, model.head_dim) == (4096, 32, 128)
    assert isinstance(model.hidden_size, int)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("num_layers", float("nan"), "num_layers: nan: must be a whole number"),
    ("head_dim", 2.5, "head_dim: 2.5: must be a whole number"),
    ("max_model_len", 0, "max_model_len: 0: must be >= 1"),
    ("num_kv_heads", True, "num_kv_heads: True: must be a whole number"),
])
def test_model_spec_refuses_bad_shapes_built_in_code(field: str, value: object, message: str) -> None:
    # NaN < 1 is false: a check by comparison alone let a NaN layer count through.
    with pytest.raises(InputError, match=re.escape(f"qwen3-8b: {message}")):
        dataclasses.replace(load_model("qwen3-8b"), **{field: value})


def test_a_directory_is_named_as_one(tmp_path: Path) -> None:
    with pytest.raises(InputError, match=f"model: '{re.escape(str(tmp_path))}': is a directory"):
        load_model(str(tmp_path))


def test_unknown_preset_suggests_one() -> None:
    with pytest.raises(InputError, match="did you mean 'h200'"):
        load_gpu("h20")


def test_sizes() -> None:
    assert parse_bytes("12GiB") == 12 * 2**30
    assert parse_bytes("500MB") == 500 * 10**6
    assert parse_bytes("1.5 KiB") == 1536
    assert parse_bytes("1024") == 1024
    for bad in ("12 furlongs", "-1GiB", "0", ""):
        with pytest.raises(InputError):
            parse_bytes(bad)
    assert format_bytes(12 * 2**30) == "12 GiB"
