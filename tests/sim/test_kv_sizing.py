"""KV sizing as vLLM sizes it (sim/kv_sizing.py), against published vLLM startup logs and hand-worked arithmetic.

Each published figure below is quoted with its source. vLLM prints GiB with two decimals, so a figure read from a
log is known to +-0.005 GiB: that rounding, and what the log's own run measured that no estimate from shapes can
(the driver's reported memory varies by 0.1 GiB between drivers), set each tolerance.
"""

from __future__ import annotations

import math
import re

import pytest

from minipaged_cli.errors import name_settings
from minipaged_cli.sim.config import SimConfig, num_blocks_for_memory, resolve_block_size
from minipaged_cli.sim.kv_sizing import activation_peak_bytes, resolve_num_blocks, size_kv_cache
from minipaged_cli.sim.vllm_releases import vllm_release
from minipaged_cli.workloads.presets import GpuSpec, load_gpu, load_model, model_from_hf_config
from tests.conftest import ROOT

GIB = 2**30
LOG_ROUNDING = 0.005 * GIB  # vLLM logs GiB to two decimals

# Meta-Llama-3-8B (config.json on the Hugging Face Hub; Llama-3.1-8B has the same shapes)
LLAMA_3_8B = model_from_hf_config(
    {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "intermediate_size": 14336,
     "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": False,
     "torch_dtype": "bfloat16", "max_position_embeddings": 8192}, name="llama-3-8b", source="test")
# Qwen/Qwen3-14B (config.json on the Hugging Face Hub)
QWEN3_14B = model_from_hf_config(
    {"model_type": "qwen3", "num_hidden_layers": 40, "hidden_size": 5120, "intermediate_size": 17408,
     "num_attention_heads": 40, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
     "tie_word_embeddings": False, "torch_dtype": "bfloat16", "max_position_embeddings": 40960},
    name="qwen3-14b", source="test")


def test_weights_count_every_tensor() -> None:
    # The checkpoints' parameter counts (model.safetensors.index.json's metadata.total_size / 2 bytes, bf16):
    # Llama-3.1-8B 8,030,261,248, Llama-2-7B 6,738,415,616, Qwen3-8B 8,190,735,360; the norms are what the
    # matrices leave (Qwen3-8B: 36 layers x (2 x 4,096 + 2 x 128 per-head q/k norms) + the final 4,096 = 308,224).
    for name, params in (("llama-3.1-8b", 8_030_261_248), ("llama-2-7b", 6_738_415_616), ("qwen3-8b", 8_190_735_360)):
        model = load_model(name)
        assert model.num_params + model.norm_params == params, name
        assert model.weight_bytes == 2 * params, name
    assert load_model("qwen3-8b").norm_params == 36 * (2 * 4096 + 2 * 128) + 4096


def test_weights_against_published_logs() -> None:
    # vLLM PR #10511 (github.com/vllm-project/vllm/pull/10511, its memory profile of Meta-Llama-3-8B on an H100):
    # "model weights take 14.96GiB". A vLLM 0.28.0 run of Qwen/Qwen3-14B on an L40S (lab notes on the book
    # "Hands-On LLM Serving and Optimization", ch. 9): "Model loading took 27.52 GiB" (which also holds the
    # rotary cache and a few buffers, hence 0.02 GiB more than the weights).
    assert abs(LLAMA_3_8B.weight_bytes - 14.96 * GIB) <= LOG_ROUNDING
    assert 0 <= 27.52 * GIB - QWEN3_14B.weight_bytes <= 0.02 * GIB


def test_activation_peak_against_published_profiles() -> None:
    # Llama-3-8B's profiling step at 8,192 tokens and 256 sequences: vLLM PR #10511 logs "PyTorch activation peak
    # memory 1.26GiB" on an H100; other published profiles of Llama-3.1-8B at the same settings (vLLM 0.6-0.8,
    # "PyTorch activation peak memory takes 1.19GiB", "... 1.21GiB", "... 1.24GiB") spread +-3 % around 1.22.
    # The estimate (the MLP's live tensors + 4 float32 copies of the sampler's logits) is hand-worked here:
    mlp = 8192 * (3 * 14336 + 2 * 4096) * 2
    sampler = 256 * 128256 * 4 * 4
    assert activation_peak_bytes(LLAMA_3_8B, 8192, 256) == mlp + sampler
    # within 10 % of every published profile: their own spread, and 4 % for what the estimate leaves out
    for published in (1.19, 1.21, 1.24, 1.26):
        assert activation_peak_bytes(LLAMA_3_8B, 8192, 256) == pytest.approx(published * GIB, rel=0.10)


def test_estimate_rule_reproduces_a_published_profile() -> None:
    # vLLM PR #10511's profile, H100, Meta-Llama-3-8B, gpu_memory_utilization 0.90: total_gpu_memory 79.22GiB,
    # non_torch_memory 1.79GiB (graphs were not charged then), available_kv_cache_memory 53.29GiB. The estimate
    # rule with that GPU's figures and minipaged's weights and activation peak:
    h100_then = GpuSpec(name="h100", memory_bytes=80e9, hbm_bandwidth_bytes_per_s=3.35e12, peak_flops=989e12,
                        step_overhead_s=0.0005, total_memory_bytes=79.22 * GIB, cuda_graph_bytes=0,
                        non_torch_bytes=1.79 * GIB)
    sizing = size_kv_cache(LLAMA_3_8B, h100_then, vllm_release("0.33"), gpu_memory_utilization=0.90,
                           max_num_batched_tokens=8192, max_num_seqs=256)
    # 0.9 x 79.22 - 14.9575 - 1.79 - 1.2705 = 53.280 GiB: within 0.05 GiB (the log's rounding of four terms, and the
    # activation estimate's 0.01 GiB above this run's measured peak)
    assert sizing.kv_memory_bytes == pytest.approx(53.29 * GIB, abs=0.05 * GIB)


def test_tokens_and_concurrency_as_the_log_reports_them() -> None:
    # vLLM 0.28.0, Qwen/Qwen3-14B on an L40S (the lab notes above): "Available KV cache memory: 11.57 GiB",
    # "GPU KV cache size: 75,824 tokens", "Maximum concurrency for 40,960 tokens per request: 1.85x". 40 layers x
    # 8 KV heads x 128 x 2 (K, V) x 2 bytes = 160 KiB a token; blocks of 16. The memory is known to +-0.005 GiB:
    # +-33 tokens, 2 blocks.
    l40s = GpuSpec(name="l40s", memory_bytes=48e9, hbm_bandwidth_bytes_per_s=0.864e12, peak_flops=362e12,
                   step_overhead_s=0.0005)
    blocks, origin, sizing = resolve_num_blocks(QWEN3_14B, l40s, 16, None, "11.57GiB", None)
    assert sizing is None and name_settings(origin) == "kv_memory=11.57GiB"  # an exact override: no sizing
    assert abs(blocks - 75_824 // 16) <= 2
    config = SimConfig.of(QWEN3_14B, l40s, num_blocks=75_824 // 16, block_size=16)
    assert config.kv_size_tokens == 75_824
    assert round(config.max_concurrency, 2) == 1.85


def test_the_extensible_rule_by_hand() -> None:
    # vLLM 0.34.0 (measure_kv_cache_bytes): min(u T - U, T - C - U - margin) - P with U = W + G + R, the transient
    # peak kept free P = A + G (the profiled activations and the graphs' estimate, Worker.peak_activation_memory),
    # margin = max(1 GiB, 0.75 P); u = 1.0 by default, so the device's bound decides.
    model, gpu = load_model("qwen3-8b"), load_gpu("h200")
    sizing = size_kv_cache(model, gpu, vllm_release("0.34"), gpu_memory_utilization=None,
                           max_num_batched_tokens=8192, max_num_seqs=1024)
    transient = activation_peak_bytes(model, 8192, 1024) + int(gpu.cuda_graph_bytes)
    resident = model.weight_bytes + int(gpu.cuda_graph_bytes) + int(gpu.non_torch_bytes)
    total = int(gpu.reported_memory_bytes)
    margin = max(GIB, int(0.75 * transient))
    assert sizing.kv_memory_bytes == total - int(gpu.cuda_context_bytes) - resident - margin - transient
    # an explicit utilization below 1 caps it, as a user's --gpu-memory-utilization 0.8 does
    capped = size_kv_cache(model, gpu, vllm_release("0.34"), gpu_memory_utilization=0.8,
                           max_num_batched_tokens=8192, max_num_seqs=1024)
    assert capped.kv_memory_bytes == math.ceil(0.8 * total) - resident - transient


def test_each_release_sizes_its_own_way_and_options_win() -> None:
    model, gpu = load_model("qwen3-8b"), load_gpu("h200")
    newest = resolve_num_blocks(model, gpu, 64, None, None, None)
    older = resolve_num_blocks(model, gpu, 16, None, None, None, vllm_version="0.33")
    assert newest[2] is not None and newest[2].extensible and newest[2].gpu_memory_utilization == 1.0
    assert older[2] is not None and not older[2].extensible and older[2].gpu_memory_utilization == 0.92
    # 0.34 gives the KV cache what 0.33's 8 % headroom kept back, less its margin and the CUDA context
    assert newest[2].kv_memory_bytes > older[2].kv_memory_bytes
    blocks, origin, _ = resolve_num_blocks(model, gpu, 16, 1234, None, None)
    assert (blocks, name_settings(origin)) == (1234, "num_blocks")


def test_bad_input_names_the_option_or_field(tmp_path) -> None:
    from typer.testing import CliRunner

    from minipaged_cli.cli.main import app
    from tests.conftest import ROOT

    trace = str(ROOT / "traces" / "burst.yaml")
    result = CliRunner().invoke(app, ["simulate", trace, "--vllm-version", "0.32"])
    assert result.exit_code == 2 and result.output.count("\n") == 1
    assert "--vllm-version: '0.32': expected one of 0.34, 0.33" in result.output
    gpu = tmp_path / "mine.yaml"
    preset = (ROOT / "configs" / "gpus" / "h100.yaml").read_text()
    gpu.write_text("\n".join("cuda_graph_bytes: -1" if line.startswith("cuda_graph_bytes:") else line
                             for line in preset.splitlines()))
    result = CliRunner().invoke(app, ["simulate", trace, "--gpu", str(gpu)])
    assert result.exit_code == 2 and "cuda_graph_bytes" in result.output and str(gpu) in result.output


GPU_ROWS = {"H200": "h200", "H100": "h100", "A100 80GB": "a100-80gb", "A100 40GB": "a100-40gb"}


def _default_pool(model_name: str, gpu_name: str, version: str) -> tuple[int, int, int, float, float]:
    """simulate's default pool under ``version``: block size, blocks, tokens, KV GiB, concurrency at the model's
    length."""
    model, gpu = load_model(model_name), load_gpu(gpu_name)
    block_size = resolve_block_size(None, model, gpu, "v1", version)
    blocks, _, sizing = resolve_num_blocks(model, gpu, block_size, None, None, None, vllm_version=version)
    assert sizing is not None
    config = SimConfig.of(model=model, gpu=gpu, num_blocks=blocks, block_size=block_size, vllm_version=version)
    return block_size, blocks, config.kv_size_tokens, sizing.kv_memory_bytes / 2**30, config.max_concurrency


def test_the_releases_page_shows_the_pools_the_code_sizes() -> None:
    page = (ROOT / "docs" / "vllm-releases.md").read_text()
    for version in ("0.33", "0.34"):
        row = re.search(rf"\| `--vllm-version {version}`[^|]*\| (\d+) \| ([\d,]+) \| ([\d,]+) tokens \| (\d+) GiB \| "
                        r"([\d.]+)x \|", page)
        assert row is not None, version
        block_size, blocks, tokens, gib, concurrency = _default_pool("qwen3-8b", "h200", version)
        assert row.groups() == (str(block_size), f"{blocks:,}", f"{tokens:,}", f"{gib:.0f}", f"{concurrency:.2f}")
    # The row before the profiles: 0.9 of the H200's 141 GB less the weights without their norms, in blocks of 16.
    model, gpu = load_model("qwen3-8b"), load_gpu("h200")
    before = num_blocks_for_memory(int(0.9 * gpu.memory_bytes - (model.weight_bytes - 2 * model.norm_params)),
                                   model, 16)
    assert f"| 16 | {before:,} | {16 * before:,} tokens |" in page
    for label, gpu_name in GPU_ROWS.items():
        row = re.search(rf"\| {label} \| (.*?) \| (.*?) \|\n", page)
        assert row is not None, label
        for cell, model_name in zip(row.groups(), ("qwen3-8b", "llama-3.1-8b"), strict=True):
            new, old = (_default_pool(model_name, gpu_name, version) for version in ("0.34", "0.33"))
            assert cell == f"{new[3]:.1f} / {old[3]:.1f} ({new[4]:.2f}x / {old[4]:.2f}x)", (label, model_name)
