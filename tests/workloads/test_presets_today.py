"""Today's model presets against their published parameter counts, their weights' bytes, and the step-time terms
of MoE, sliding windows, latent attention and an fp8 KV cache: every expected number worked by hand from the
config.json values written out here, independently of the code under test."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from minipaged_cli.sim.calibration import Calibration, Grid
from minipaged_cli.sim.step_time import LayerModel, StepTimeModel, elementwise_bytes_per_token, experts_touched
from minipaged_cli.workloads.presets import load_gpu, load_model, model_from_hf_config, with_kv_cache_dtype
from tests.conftest import ROOT

GATED = 3  # gate, up and down matrices of a gated MLP (or expert)


def gpt_oss(layers: int, experts: int) -> tuple[int, int]:
    """(total, active) weights of gpt-oss: 64 query heads and 8 KV heads of 64, hidden 2880, experts of 2880,
    4 per token, a router, vocab 201,088 untied. Biases and attention sinks (~0.04 %) left out."""
    attention = 2880 * (2 * 64 * 64 + 2 * 8 * 64)
    expert, router = GATED * 2880 * 2880, 2880 * experts
    embeddings = 2 * 201088 * 2880
    return (layers * (attention + experts * expert + router) + embeddings,
            layers * (attention + 4 * expert + router) + embeddings)


def deepseek_v3() -> tuple[int, int]:
    """DeepSeek-V3: 61 layers of MLA (q_lora_rank 1536, kv_lora_rank 512, 128 heads of 128 + 64 rotary, v 128),
    the first 3 with a dense MLP of 18,432, the other 58 with 256 routed experts of 2048 (8 per token), 1 shared,
    a router; vocab 129,280 untied."""
    heads = 128
    q = 7168 * 1536 + 1536 * heads * (128 + 64)
    kv = 7168 * (512 + 64) + 512 * heads * (128 + 128)
    attention = q + kv + heads * 128 * 7168
    dense = GATED * 7168 * 18432
    expert, router = GATED * 7168 * 2048, 7168 * 256
    embeddings = 2 * 129280 * 7168
    return (61 * attention + 3 * dense + 58 * ((256 + 1) * expert + router) + embeddings,
            61 * attention + 3 * dense + 58 * ((8 + 1) * expert + router) + embeddings)


def qwen3_30b_a3b() -> tuple[int, int]:
    """Qwen3-30B-A3B: 48 layers, 32 query and 4 KV heads of 128, hidden 2048, 128 experts of 768 (8 per token),
    a router; vocab 151,936 untied."""
    attention = 2048 * (2 * 32 * 128 + 2 * 4 * 128)
    expert, router = GATED * 2048 * 768, 2048 * 128
    embeddings = 2 * 151936 * 2048
    return 48 * (attention + 128 * expert + router) + embeddings, 48 * (attention + 8 * expert + router) + embeddings


def dense(layers: int, hidden: int, intermediate: int, heads: int, kv_heads: int, vocab: int, tied: bool) -> int:
    attention = hidden * (2 * heads * 128 + 2 * kv_heads * 128)
    return layers * (attention + GATED * hidden * intermediate) + (1 if tied else 2) * vocab * hidden


GPT_OSS_120B, GPT_OSS_20B = gpt_oss(36, 128), gpt_oss(24, 32)
# The embedding matrix that gpt-oss's "active" leaves out (see below).
UNCOUNTED_EMBEDDING = {"gpt-oss-120b": 201088 * 2880, "gpt-oss-20b": 201088 * 2880}


@pytest.mark.parametrize(("name", "hand", "published_total", "published_active", "active_hand"), [
    # gpt-oss model card (Table 1): 116.83 B total, 5.13 B active; 20.91 B / 3.61 B. Its "active" counts the
    # unembedding, not the embedding lookup: active less one vocab x hidden matrix.
    ("gpt-oss-120b", GPT_OSS_120B[0], 116.83e9, 5.13e9, GPT_OSS_120B[1] - 201088 * 2880),
    ("gpt-oss-20b", GPT_OSS_20B[0], 20.91e9, 3.61e9, GPT_OSS_20B[1] - 201088 * 2880),
    # DeepSeek-V3 technical report: 671 B total, 37 B activated per token (the MTP module apart).
    ("deepseek-v3", deepseek_v3()[0], 671e9, 37e9, deepseek_v3()[1]),
    # Qwen3-30B-A3B model card: 30.5 B total, 3.3 B activated.
    ("qwen3-30b-a3b", qwen3_30b_a3b()[0], 30.5e9, 3.3e9, qwen3_30b_a3b()[1]),
    # Llama 3.1 model card: 8 B and 70 B (8.03 B and 70.6 B on the Hub); dense, all active.
    ("llama-3.1-8b", dense(32, 4096, 14336, 32, 8, 128256, False), 8.03e9, 8.03e9,
     dense(32, 4096, 14336, 32, 8, 128256, False)),
    ("llama-3.1-70b", dense(80, 8192, 28672, 64, 8, 128256, False), 70.6e9, 70.6e9,
     dense(80, 8192, 28672, 64, 8, 128256, False)),
    # Gemma 3 27B: 27 B (the 0.4 B SigLIP vision encoder is not in the text config).
    ("gemma-3-27b", dense(62, 5376, 21504, 32, 16, 262208, True), 27.0e9, 27.0e9,
     dense(62, 5376, 21504, 32, 16, 262208, True)),
])
def test_parameter_counts_worked_by_hand_match_the_published(name, hand, published_total, published_active,
                                                             active_hand) -> None:
    model = load_model(name)
    assert model.num_params == hand
    assert hand == pytest.approx(published_total, rel=0.02)
    active = model.num_active_params - UNCOUNTED_EMBEDDING.get(name, 0)
    assert active == active_hand
    assert active_hand == pytest.approx(published_active, rel=0.03)


def test_weight_bytes_count_each_format() -> None:
    # gpt-oss: routed experts in MXFP4 (4 bits + one 8-bit scale per 32 = 4.25 bits), the rest bf16; every model's
    # norms in its dtype (ModelSpec.norm_params: gpt-oss's 36 layers x 2 x 2,880 + the final 2,880).
    experts = 36 * 128 * GATED * 2880 * 2880
    norms = 36 * 2 * 2880 + 2880
    expected = experts * 4.25 / 8 + (GPT_OSS_120B[0] - experts + norms) * 2
    model = load_model("gpt-oss-120b")
    assert model.norm_params == norms
    assert model.weight_bytes == pytest.approx(expected, rel=1e-12)
    assert model.weight_bytes < 80e9  # the model card: gpt-oss-120b runs on a single 80 GB GPU
    assert load_model("gpt-oss-20b").weight_bytes < 16e9  # ... and gpt-oss-20b within 16 GB
    # DeepSeek-V3: every layer's weights in fp8 (1 byte), the embeddings and LM head in bf16.
    # Its norms: 61 layers x (2 x 7,168 + the latents' q_lora_rank 1,536 and kv_lora_rank 512) + the final 7,168.
    embeddings = 2 * 129280 * 7168
    norms = 61 * (2 * 7168 + 1536 + 512) + 7168
    assert load_model("deepseek-v3").weight_bytes == (deepseek_v3()[0] - embeddings) + 2 * (embeddings + norms)
    assert load_model("llama-3.1-8b").weight_bytes == 2 * (dense(32, 4096, 14336, 32, 8, 128256, False)
                                                           + 32 * 2 * 4096 + 4096)


@pytest.mark.parametrize(("name", "kv_bytes"), [
    ("gpt-oss-120b", 36 * 2 * 8 * 64 * 2),  # every layer as full attention: K and V, 8 heads of 64, bf16
    ("gpt-oss-20b", 24 * 2 * 8 * 64 * 2),
    ("gemma-3-27b", 62 * 2 * 16 * 128 * 2),
    ("llama-3.1-8b", 32 * 2 * 8 * 128 * 2),  # 128 KiB
    ("llama-3.1-70b", 80 * 2 * 8 * 128 * 2),  # 320 KiB
    ("deepseek-v3", 61 * (512 + 64) * 2),  # one latent of 576 per layer
    ("qwen3-30b-a3b", 48 * 2 * 4 * 128 * 2),
])
def test_kv_bytes_per_token_and_layer_kinds(name, kv_bytes) -> None:
    model = load_model(name)
    assert model.kv_bytes_per_token == kv_bytes
    assert with_kv_cache_dtype(model, "fp8_e5m2").kv_bytes_per_token == kv_bytes // 2


def test_layer_kinds_of_the_hybrid_presets() -> None:
    gpt = load_model("gpt-oss-120b")  # alternating, sliding first, window 128
    assert gpt.layer_kinds[:2] == ("sliding_attention", "full_attention") and gpt.num_sliding_layers == 18
    assert gpt.sliding_window == 128
    gemma = load_model("gemma-3-27b")  # five local to one global, window 1,024: 10 global of 62
    assert gemma.num_sliding_layers == 52 and gemma.sliding_window == 1024
    assert [i for i, kind in enumerate(gemma.layer_kinds) if kind == "full_attention"][:2] == [5, 11]


def test_experts_touched_against_enumeration() -> None:
    # 4 experts, 2 per token: enumerate every routing of 1, 2 and 3 tokens and average the distinct experts.
    model = model_from_hf_config({"num_hidden_layers": 1, "hidden_size": 8, "intermediate_size": 8,
                                  "num_attention_heads": 1, "vocab_size": 8, "max_position_embeddings": 8,
                                  "num_local_experts": 4, "num_experts_per_tok": 2}, name="m", source="m")
    choices = list(itertools.combinations(range(4), 2))
    for tokens in (1, 2, 3):
        routings = list(itertools.product(choices, repeat=tokens))
        mean = sum(len(set().union(*routing)) for routing in routings) / len(routings)
        assert experts_touched(model, tokens) == pytest.approx(mean, rel=1e-12)
    assert experts_touched(model, 0) == 0
    assert experts_touched(model, 10_000) == pytest.approx(4)


def test_moe_weight_reads_grow_from_active_to_all_experts() -> None:
    model, gpu = load_model("qwen3-30b-a3b"), load_gpu("h200")
    layer = LayerModel(model, gpu)
    bandwidth = 4.8e12 * gpu.gemm_bandwidth_efficiency
    flops = 989e12 * gpu.gemm_flops_efficiency
    attention = 2048 * (2 * 32 * 128 + 2 * 4 * 128)
    expert, router = GATED * 2048 * 768, 2048 * 128
    # One token: attention, router and its 8 experts, computed and read (bf16).
    one = 2 * (attention + router + 8 * expert) / flops + 2 * (attention + router + 8 * expert) / bandwidth
    assert layer.linear(1) == pytest.approx(one, rel=1e-9)
    # 256 tokens: 128 * (1 - (1 - 8/128)^256) = 127.99997 distinct experts expected: all of them read.
    touched = 128 * (1 - (1 - 8 / 128) ** 256)
    many = 256 * 2 * (attention + router + 8 * expert) / flops + 2 * (attention + router + touched * expert) / bandwidth
    assert layer.linear(256) == pytest.approx(many, rel=1e-9)


def test_sliding_layers_read_only_their_window_when_decoding() -> None:
    # Gemma 3 27B, 2 decoders of 5,000 tokens each: 10 global layers read 10,000 tokens, 52 local layers 2 * 1,024.
    model, gpu = load_model("gemma-3-27b"), load_gpu("h200")
    per_layer = 2 * 16 * 128 * 2  # K and V bytes of one token in one layer
    streaming = 4.8e12 * gpu.attention_bandwidth_efficiency
    expected = (10 * 10_000 + 52 * 2 * 1024) * per_layer / streaming
    step = StepTimeModel(model, gpu)
    assert step.decode_attention_seconds(2, 10_000) == pytest.approx(expected, rel=1e-12)
    # Within the window every layer reads every token, as a full-attention model does.
    assert step.decode_attention_seconds(2, 1_000) == pytest.approx(62 * 1_000 * per_layer / streaming, rel=1e-12)


def test_mla_reads_its_latent_and_spends_absorbed_flops() -> None:
    model, gpu = load_model("deepseek-v3"), load_gpu("h200")
    streaming = 4.8e12 * gpu.attention_bandwidth_efficiency
    step = StepTimeModel(model, gpu)
    # 4 decoders reading 8,000 tokens: 61 layers of one 576-element bf16 latent each; fp8 halves it.
    assert step.decode_attention_seconds(4, 8_000) == pytest.approx(8_000 * 61 * 576 * 2 / streaming, rel=1e-12)
    fp8 = StepTimeModel(with_kv_cache_dtype(model, "fp8_e4m3"), gpu)
    assert fp8.decode_attention_seconds(4, 8_000) == pytest.approx(8_000 * 61 * 576 / streaming, rel=1e-12)
    # Absorbed MLA: each of 128 heads dots the 576-element latent (QK) and sums 512-element latents (PV), a
    # multiply-add (2 FLOPs) per element, every layer.
    assert model.attention_flops_per_context_token == 61 * 128 * 2 * (576 + 512)


def test_a_calibrated_decode_reads_the_window_on_sliding_layers() -> None:
    # 4 layers, every second one global (pattern 2), window 64; a decode table measured on this model, per layer:
    # 5e-6 s for one sequence of 64 tokens, 2e-5 s for one of 4,096.
    model = model_from_hf_config({"num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 128,
                                  "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
                                  "max_position_embeddings": 8192, "sliding_window": 64,
                                  "sliding_window_pattern": 2}, name="m", source="m")
    calibration = Calibration(gpu="h200", model=model, source="test",
                              decode_attention=Grid(np.array([1.0, 16]), np.array([64.0, 4096]),
                                                    np.array([[5e-6, 2e-5], [1e-5, 3e-4]])))
    step = StepTimeModel(model, load_gpu("h200"), calibration)
    # One sequence of 4,096 tokens: 2 global layers read all of it, 2 sliding layers their 64.
    assert float(step.decode_attention_seconds(1, 4096)) == pytest.approx(2 * 2e-5 + 2 * 5e-6, rel=1e-12)


def test_moe_elementwise_activates_each_expert_a_token_goes_to() -> None:
    # gpt-oss-120b, per token and layer: two fused add + RMSNorms (4 x 2880 each), RoPE on Q (64 x 64) and K
    # (8 x 64) in and out, SwiGLU over 4 experts of 2880 (gate and up in, one out), in bf16.
    expected = (2 * 4 * 2880 + 2 * (64 * 64 + 8 * 64) + 3 * 4 * 2880) * 2
    assert elementwise_bytes_per_token(load_model("gpt-oss-120b")) == expected


def test_mla_elementwise_ropes_the_rotary_parts_and_normalises_the_latents() -> None:
    # DeepSeek-V3, per token and layer: two fused add + RMSNorms (4 x 7168 each); RoPE on Q's rotary part
    # (128 heads x 64) and the shared rotary key (64), in and out; q_a_layernorm (1536) and kv_a_layernorm (512),
    # in and out; SwiGLU over the active intermediate width (gate and up in, one out); bf16 activations.
    model = load_model("deepseek-v3")
    expected = (2 * 4 * 7168 + 2 * (128 * 64 + 64 + 1536 + 512) + 3 * model.active_intermediate_size) * 2
    assert elementwise_bytes_per_token(model) == expected


def test_sliding_layers_attend_to_at_most_their_window_in_prefill() -> None:
    # Gemma 3 27B prefilling one 4,096-token prompt: a global layer's queries attend to 4,096 * 4,097 / 2 keys,
    # a local layer's to at most 1,024 each (4,096 * 1,024 bound the exact 3,670,528 from above). FLOP-bound.
    model, gpu = load_model("gemma-3-27b"), load_gpu("h200")
    per_pair = 2 * 32 * 2 * 128 / (989e12 * gpu.attention_flops_efficiency)  # QK and PV, 32 heads of 128
    pairs = 4096 * 4097 / 2
    expected = (10 * pairs + 52 * 4096 * 1024) * per_pair
    seconds = StepTimeModel(model, gpu).prefill_attention_seconds(4096, pairs, 4096)
    assert seconds == pytest.approx(expected, rel=1e-12)


def test_the_todays_models_page_shows_what_the_presets_hold() -> None:
    # docs/studies/todays-models.md's table of sizes: parameters (active ones for a mixture of experts), weights as
    # loaded (norms included), KV bytes a token
    page = (ROOT / "docs" / "studies" / "todays-models.md").read_text()
    rows = re.findall(r"^\| ([a-z0-9.-]+) \| ([^|]+) \| ([\d.]+) GB \| ([\d,]+)(?: \(MLA latent\))? \|$", page, re.M)
    assert len(rows) == 7
    for name, params, weights, kv_bytes in rows:
        model = load_model(name)
        active = f" ({model.num_active_params / 1e9:.3g} B)" if model.num_active_params < model.num_params else ""
        assert params.strip() == f"{model.num_params / 1e9:.1f} B{active}", name
        assert weights == f"{model.weight_bytes / 1e9:.1f}", name
        assert kv_bytes == f"{model.kv_bytes_per_token:,}", name
