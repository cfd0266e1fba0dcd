"""The hybrid KV cache manager's options: refused with one line naming the option and the value, exit 2; and the
simulate command's table and JSON for a model with sliding windows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from minipaged_cli.cli.main import app
from tests.conftest import ROOT

runner = CliRunner()
MIXED = str(ROOT / "traces" / "mixed.yaml")


@pytest.fixture
def windowed_config(tmp_path: Path) -> str:
    """A small model in Hugging Face's keys: 4 layers alternating sliding window 64 / full attention."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps({
        "model_type": "gpt_oss", "num_hidden_layers": 4, "hidden_size": 256, "intermediate_size": 512,
        "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 1000,
        "tie_word_embeddings": False, "torch_dtype": "bfloat16", "max_position_embeddings": 8192,
        "sliding_window": 64, "layer_types": ["sliding_attention", "full_attention"] * 2}))
    return str(path)


def test_v0_with_the_hybrid_manager_is_refused(windowed_config: str) -> None:
    result = runner.invoke(app, ["simulate", MIXED, "--model", windowed_config, "--kv-memory", "64MiB",
                                 "--scheduler", "v0", "--hybrid-kv"])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert "--hybrid-kv" in result.output and "--scheduler v0" in result.output


def test_sweep_refuses_a_hybrid_kv_that_is_not_on_or_off(tmp_path: Path, windowed_config: str) -> None:
    config = tmp_path / "sweep.yaml"
    config.write_text("hybrid_kv: maybe\n")
    result = runner.invoke(app, ["sweep", MIXED, "--model", windowed_config, "--rates", "1", "--config", str(config)])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert "hybrid_kv: 'maybe': expected on or off" in result.output


def test_simulate_shows_every_layer_full_beside_the_groups(windowed_config: str, tmp_path: Path) -> None:
    # 64 MiB of KV: one layer's page of 16 tokens is 16 x 2 x 2 x 64 x 2 B = 8 KiB; a hybrid block (a group of 2
    # layers) 16 KiB -> 4,096 blocks; every layer full (4 layers a block) 32 KiB -> 2,048 blocks
    out = tmp_path / "out.json"
    result = runner.invoke(app, ["simulate", MIXED, "--model", windowed_config, "--kv-memory", "64MiB",
                                 "--strategies", "paged", "--block-size", "16", "--json", str(out)])
    assert result.exit_code == 0, result.output
    assert "Hybrid KV cache manager vs every layer full attention" in result.output
    document = json.loads(out.read_text())
    assert document["config"]["num_blocks"] == 4096 and document["config"]["kv_cache_groups"] == 2
    assert document["config"]["hybrid_kv"] is True
    assert document["paged_all_full_attention"]["num_blocks"] == 2048
    result = runner.invoke(app, ["simulate", MIXED, "--model", windowed_config, "--kv-memory", "64MiB",
                                 "--strategies", "paged", "--no-hybrid-kv", "--block-size", "16", "--json", str(out)])
    document = json.loads(out.read_text())
    assert document["config"]["num_blocks"] == 2048 and document["config"]["hybrid_kv"] is False
    assert "paged_all_full_attention" not in document
