"""Layer types, sliding windows, latent attention and the KV dtype read from Hugging Face configs; the bytes per
token worked by hand from the configs' published shapes."""

import pytest

from minipaged_cli.cli.flags import error_line
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
    assert "--kv-cache-dtype" in error_line(error.value)  # the library names the setting, the CLI its flag


@pytest.mark.parametrize("model_type", ["gemma2", "gemma3_text", "gpt_oss", "cohere2", "mistral"])
@pytest.mark.parametrize("num_layers", [4, 12, 62])
@pytest.mark.parametrize("window", [None, 512])
def test_a_config_without_layer_types_gets_hugging_faces_defaults(model_type, num_layers, window):
    # The reference: transformers' own config class for the type, given the same keys (a config.json that leaves out
    # layer_types, and sliding_window too where window is None).
    transformers = pytest.importorskip("transformers")
    given = {"num_hidden_layers": num_layers} if window is None else {"num_hidden_layers": num_layers,
                                                                     "sliding_window": window}
    reference = transformers.CONFIG_MAPPING[model_type](**given)
    spec = model(model_type=model_type, **given)
    # (MistralConfig has no layer_types: its model masks every layer with the window)
    expected = getattr(reference, "layer_types", None) or [SLIDING_ATTENTION] * num_layers
    assert spec.layer_kinds == tuple(expected)
    assert spec.sliding_window == reference.sliding_window


def test_gemma_3s_pattern_key_still_sets_the_layers_and_null_is_refused():
    transformers = pytest.importorskip("transformers")
    reference = transformers.Gemma3TextConfig(num_hidden_layers=12, sliding_window_pattern=4)
    spec = model(model_type="gemma3_text", num_hidden_layers=12, sliding_window_pattern=4)
    assert spec.layer_kinds == tuple(reference.layer_types)
    with pytest.raises(InputError) as error:  # (transformers fails on it with a TypeError, unless layer_types)
        model(model_type="gemma3_text", sliding_window_pattern=None)
    assert error.value.field == "sliding_window_pattern"


@pytest.mark.parametrize("pattern", ["LLLG", None, 2])
def test_layer_types_win_over_any_pattern(pattern):
    # EXAONE 4's config.json writes its pattern as a string beside layer_types; transformers reads layer_types only
    layer_types = ["sliding_attention"] * 3 + ["full_attention"]
    spec = model(model_type="exaone4", layer_types=layer_types, sliding_window=4096, sliding_window_pattern=pattern)
    assert spec.layer_kinds == tuple(layer_types) and spec.sliding_window == 4096


@pytest.mark.parametrize("model_type", [{}, ["llama"], 3])
def test_a_model_type_that_is_not_a_name_is_refused(model_type):
    with pytest.raises(InputError) as error:
        model(model_type=model_type)
    assert error.value.field == "model_type"


def test_empty_layer_types_are_refused_and_null_ones_take_the_default():
    with pytest.raises(InputError, match="no entries for 4 layers") as error:
        model(layer_types=[], sliding_window=128)
    assert error.value.field == "layer_types"
    assert model(model_type="gpt_oss", layer_types=None).layer_kinds == (SLIDING_ATTENTION, FULL_ATTENTION) * 2


def test_a_shape_the_model_refuses_names_the_file():
    with pytest.raises(InputError) as error:
        model(num_key_value_heads=3)  # 4 query heads are not a multiple of 3
    assert error.value.source == "config.json" and error.value.field == "num_key_value_heads"


def test_a_config_that_is_not_text_is_bad_input(tmp_path):
    from minipaged_cli.workloads.presets import load_gpu, load_model

    path = tmp_path / "config.json"
    path.write_bytes(b"\xff\xfe\x00{")
    for load in (load_model, load_gpu):
        with pytest.raises(InputError, match="cannot read") as error:
            load(str(path))
        assert error.value.source == str(path)


@pytest.mark.parametrize("model_type", ["qwen2", "qwen3"])
@pytest.mark.parametrize("extra", [
    {"use_sliding_window": True, "sliding_window": 512},
    {"use_sliding_window": True, "sliding_window": 512, "max_window_layers": 3},
    {"use_sliding_window": True, "sliding_window": 512, "max_window_layers": 0},
    {"use_sliding_window": True, "max_window_layers": 3},  # (the window's default)
    {"sliding_window": 512, "max_window_layers": 3},  # (without use_sliding_window, Qwen's default is off)
])
def test_qwens_sliding_window_starts_at_max_window_layers(model_type, extra):
    transformers = pytest.importorskip("transformers")
    given = {"num_hidden_layers": 30, **extra}
    reference = transformers.CONFIG_MAPPING[model_type](**given)
    spec = model(model_type=model_type, **given)
    assert spec.layer_kinds == tuple(reference.layer_types)
    assert spec.sliding_window == reference.sliding_window
