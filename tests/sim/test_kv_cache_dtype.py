"""``--kv-cache-dtype`` in the simulator: an fp8 cache holds twice the blocks of a bf16 one in the same memory,
moves half the bytes per token, and the header and --json say which."""

from __future__ import annotations

import json
import math

import pytest
from typer.testing import CliRunner

from minipaged_cli.cli.main import app
from minipaged_cli.sim.step_time import StepTimeModel
from minipaged_cli.workloads.presets import load_gpu, load_model, with_kv_cache_dtype
from tests.conftest import ROOT

runner = CliRunner()
TRACE = str(ROOT / "traces" / "burst.yaml")


@pytest.mark.parametrize("dtype", ["fp8", "fp8_e4m3", "fp8_e5m2"])
def test_simulate_sizes_the_cache_in_the_kv_dtype(dtype: str) -> None:
    # Llama 3.1 8B on an H200: the memory vLLM's sizing leaves to the KV cache (the same whatever its dtype:
    # tests/sim/test_kv_sizing.py checks how it is sized), in blocks of 16 tokens of 32 layers * 2 * 8 heads * 128 *
    # (2 bytes, or 1 in fp8).
    memories = set()
    for kv_dtype, element_bytes in (("auto", 2), (dtype, 1)):
        result = runner.invoke(app, ["simulate", TRACE, "--model", "llama-3.1-8b", "--strategies", "paged",
                                     "--kv-cache-dtype", kv_dtype, "--block-size", "16", "--json", "-"])
        assert result.exit_code == 0, result.output
        config = json.loads(result.stdout[result.stdout.index("{"):])["config"]
        assert config["kv_cache_dtype"] == kv_dtype
        assert config["kv_bytes_per_token"] == 32 * 2 * 8 * 128 * element_bytes
        memory = config["kv_sizing"]["kv_memory_bytes"]
        memories.add(memory)
        assert config["num_blocks"] == math.floor(memory / (16 * 32 * 2 * 8 * 128 * element_bytes))
    assert len(memories) == 1


def test_header_names_the_kv_dtype_and_bytes() -> None:
    result = runner.invoke(app, ["simulate", TRACE, "--model", "llama-3.1-8b", "--strategies", "paged",
                                 "--kv-cache-dtype", "fp8_e5m2"])
    assert result.exit_code == 0, result.output
    assert "KV cache fp8_e5m2, 65,536 B a token" in result.output
    result = runner.invoke(app, ["simulate", TRACE, "--model", "llama-3.1-8b", "--strategies", "paged"])
    assert "KV cache bfloat16, 131,072 B a token" in result.output


def test_fp8_halves_the_bytes_a_decode_step_reads_and_writes() -> None:
    model, gpu = load_model("llama-3.1-70b"), load_gpu("h200")
    auto, fp8 = StepTimeModel(model, gpu), StepTimeModel(with_kv_cache_dtype(model, "fp8_e4m3"), gpu)
    streaming = 4.8e12 * 0.80
    # 64 decoders over 4,000 tokens each: 80 layers * 2 * 8 heads * 128 elements of 2 bytes, or 1.
    assert auto.decode_attention_seconds(64, 256_000) == pytest.approx(256_000 * 327_680 / streaming, rel=1e-12)
    assert fp8.decode_attention_seconds(64, 256_000) == pytest.approx(256_000 * 163_840 / streaming, rel=1e-12)
    assert fp8.cache_write_seconds(64) == pytest.approx(auto.cache_write_seconds(64) / 2, rel=1e-12)


def test_sweep_points_use_the_kv_dtype(tmp_path) -> None:
    from minipaged_cli.apps.sweep_points import Point, Settings, prepare
    from minipaged_cli.workloads.readers import load_trace

    trace = load_trace(ROOT / "traces" / "burst.yaml", "auto")
    point = Point("llama-3.1-8b", "h200", "8GiB", 16, True, "paged", 1.0)
    blocks = {dtype: prepare(trace, Settings(kv_cache_dtype=dtype), [point]).configs[point.curve].cache.num_blocks
              for dtype in ("auto", "fp8_e4m3")}
    # 8 GiB in blocks of 16 tokens of 128 KiB (bf16) or 64 KiB (fp8).
    assert blocks == {"auto": 8 * 2**30 // (16 * 2**17), "fp8_e4m3": 8 * 2**30 // (16 * 2**16)}
    config = tmp_path / "sweep.yaml"
    config.write_text("rates: [1]\nstrategies: [paged]\nmodels: [llama-3.1-8b]\nkv_cache_dtype: fp8_e5m2\n")
    result = runner.invoke(app, ["sweep", str(ROOT / "traces" / "burst.yaml"), "--config", str(config),
                                 "--workers", "1", "--json", "-"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout[result.stdout.index("{"):])["settings"]["kv_cache_dtype"] == "fp8_e5m2"
