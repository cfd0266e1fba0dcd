"""Bad MoE, MLA and quantization fields of a config.json, and an unknown --kv-cache-dtype: one line naming the
field, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from minipaged_cli.cli.main import app
from minipaged_cli.errors import InputError
from minipaged_cli.workloads.presets import model_from_hf_config
from tests.conftest import ROOT

BASE = {"num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 128, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 100, "max_position_embeddings": 512}
MOE = {"num_local_experts": 8, "num_experts_per_tok": 2}


@pytest.mark.parametrize(("extra", "field"), [
    ({"num_local_experts": 8, "num_experts_per_tok": 9}, "num_experts_per_tok"),
    ({"num_local_experts": 8}, "num_experts_per_tok"),
    ({"num_experts_per_tok": 2}, "num_experts_per_tok"),
    ({"n_routed_experts": 0, "num_experts_per_tok": 2}, "n_routed_experts"),
    ({**MOE, "first_k_dense_replace": 4}, "first_k_dense_replace"),
    ({**MOE, "n_shared_experts": -1}, "n_shared_experts"),
    ({**MOE, "moe_intermediate_size": 0}, "moe_intermediate_size"),
    ({"kv_lora_rank": 512, "qk_rope_head_dim": 64, "q_lora_rank": 2.5}, "q_lora_rank"),
    ({"quantization_config": {"quant_method": "awq"}}, "quantization_config.quant_method"),
])
def test_bad_fields_are_refused_naming_them(extra, field) -> None:
    with pytest.raises(InputError) as error:
        model_from_hf_config({**BASE, **extra}, name="m", source="config.json")
    assert error.value.field == field and error.value.source == "config.json"


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "minipaged_cli", *args], capture_output=True, text=True, env=env,
                          cwd=ROOT, timeout=120)


@pytest.mark.parametrize("command", ["simulate", "profile"])
def test_unknown_kv_cache_dtype_is_one_line_exit_2(command: str) -> None:
    result = _cli(command, "traces/mixed.yaml", "--kv-cache-dtype", "fp4")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--kv-cache-dtype" in lines[0] and "'fp4'" in lines[0] and "Traceback" not in lines[0]


def test_unknown_kv_cache_dtype_in_a_sweep_config(tmp_path: Path) -> None:
    config = tmp_path / "sweep.yaml"
    config.write_text(json.dumps({"rates": [1], "kv_cache_dtype": "int8"}))
    result = _cli("sweep", "traces/mixed.yaml", "--config", str(config))
    assert result.returncode == 2, result.stderr
    line, = result.stderr.strip().splitlines()
    assert "kv_cache_dtype: 'int8': expected one of auto, fp8, fp8_e4m3, fp8_e5m2" in line, line


@pytest.mark.parametrize("args", [
    ["run", "traces/mixed.yaml", "--device", "cpu", "--limit", "3", "--max-steps", "3", "--kv-memory", "256MiB"],
    ["profile", "traces/mixed.yaml", "--device", "cpu", "--limit", "3", "--block-size", "16", "--kv-memory", "1GiB"],
    ["profile", "traces/mixed.yaml", "--offload", "--limit", "3", "--block-size", "16", "--kv-memory", "1GiB"],
    ["calibrate", "out.yaml", "--device", "cpu", "--quick"],
])
def test_the_data_plane_refuses_latent_attention(args: list[str], tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    # Its cache holds per-head K and V; DeepSeek-V3 caches one 512 + 64 latent a token (its pool was sized from one
    # and shaped as the other).
    pytest.importorskip("torch")
    monkeypatch.chdir(ROOT)
    args = [str(tmp_path / arg) if arg == "out.yaml" else arg for arg in args]
    result = CliRunner().invoke(app, [*args, "--model", "deepseek-v3"])
    assert result.exit_code == 2, result.output
    line, = result.stderr.strip().splitlines()
    assert line.startswith("error: --model: 'deepseek-v3': multi-head latent attention (a 512 + 64 latent"), line
    assert not list(tmp_path.iterdir())


def test_profile_of_a_latent_attention_model_times_no_kernels_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    result = CliRunner().invoke(app, ["profile", "traces/mixed.yaml", "--limit", "3", "--block-size", "16",
                                      "--kv-memory", "1GiB", "--model", "deepseek-v3", "--json", "-"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["device"] == "none", {key: report[key] for key in report if key != "rows"}
