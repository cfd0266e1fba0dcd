"""Layer types, sliding windows, latent attention and the KV dtype read from Hugging Face configs; the bytes per
token worked by hand from the configs' published shapes."""

import pytest

from minipaged_cli.errors import InputError
from minipaged_cli.workloads.presets import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    model_from_hf_config,
    with_kv_cache_dtype,
)

BASE = {"num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 16, "vocab_size": 100, "max_position_embeddings": 512}


def model(**extra):
    return model_from_hf_config({**BASE, **extra}, name="m", source="config.json")


def test_layer_types_list_as_gpt_oss_writes_it():
    spec = model(layer_types=["sliding_attention", "full_attention"] * 2, sliding_window=128)
    assert spec.layer_kinds == (SLIDING_ATTENTION, FULL_ATTENTION) * 2
    assert spec.num_sliding_layers == 2 and spec.is_hybrid and spec.sliding_window == 128


def test_sliding_window_pattern_makes_every_pattern_th_layer_global():
    spec = model(num_hidden_layers=12, sliding_window=1024, sliding_window_pattern=6)  # Gemma 3: 5 local, 1 global
    assert [i for i, kind in enumerate(spec.layer_kinds) if kind == FULL_ATTENTION] == [5, 11]


def test_window_alone_slides_every_layer_unless_switched_off():
    assert model(sliding_window=4096).num_sliding_layers == 4  # Mistral 7B v0.1
    assert not model(sliding_window=4096, use_sliding_window=False).is_hybrid  # Qwen2/3 write it this way
    assert not model(sliding_window=None).is_hybrid


def test_bytes_per_token_worked_by_hand():
    # K and V: 2 * 2 heads * 16 dims * 2 bytes (bfloat16) = 128 B per layer, 4 layers.
    assert model().kv_bytes_per_token == 4 * 128
    assert with_kv_cache_dtype(model(), "fp8_e4m3").kv_bytes_per_token == 4 * 64
    # DeepSeek-V3's latent: (512 + 64) elements * 2 bytes per layer, no separate K and V.
    mla = model(kv_lora_rank=512, qk_rope_head_dim=64)
    assert mla.is_mla and mla.kv_bytes_per_token_per_layer == 576 * 2


@pytest.mark.parametrize(("extra", "field"), [
    ({"layer_types": ["full_attention"] * 3}, "layer_types"),
    ({"layer_types": ["full_attention", "linear"] * 2}, "layer_types"),
    ({"layer_types": ["sliding_attention"] * 4}, "sliding_window"),
    ({"layer_types": ["sliding_attention"] * 4, "sliding_window": 0}, "sliding_window"),
    ({"sliding_window": -5}, "sliding_window"),
    ({"kv_lora_rank": 512}, "kv_lora_rank"),
])
def test_inconsistent_layers_are_refused_naming_the_field(extra, field):
    with pytest.raises(InputError) as error:
        model(**extra)
    assert error.value.field == field and error.value.source == "config.json"


def test_unknown_kv_cache_dtype_is_refused():
    with pytest.raises(InputError, match="fp8_e4m3") as error:
        with_kv_cache_dtype(model(), "fp8_e4m4")
    assert error.value.field == "--kv-cache-dtype"
