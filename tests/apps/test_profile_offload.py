"""profile --offload: KV offloading's cost per block size in both host layouts (apps/profile.py time_offload)."""

from __future__ import annotations

import json

import pytest
import torch
from typer.testing import CliRunner

from minipaged_cli.apps.profile import time_offload
from minipaged_cli.cli import profile as profile_cli
from minipaged_cli.cli.main import app
from minipaged_cli.dataplane.backends import TorchBackend
from minipaged_cli.workloads.presets import load_model


@pytest.mark.parametrize("block_size", [1, 16])
def test_time_offload_counts_the_copies_each_layout_makes(block_size: int) -> None:
    model = load_model("qwen3-0.6b")  # 28 layers, 8 kv heads of 128
    layers = 4
    costs = time_offload(TorchBackend("cpu"), model, block_size, torch.bfloat16, layers, 2**20, repeat=1)
    head_block = block_size * 8 * 128 * 2  # one layer's K (or V) block, bf16: what a per-layer copy moves
    block = 2 * layers * head_block
    assert [(c.layout, c.copies_per_block, c.copy_bytes) for c in costs] == [
        ("contiguous", 1, block), ("per-layer", 2 * layers, head_block)]
    assert all(c.num_blocks == 2**20 // block and c.store_gbps > 0 and c.load_gbps > 0 for c in costs)


@pytest.mark.slow
def test_profile_offload_reports_each_block_size_and_layout(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(profile_cli.OFFLOAD_BYTES, "torch", 2**20)  # a test's worth: 1 MiB a call
    result = CliRunner().invoke(app, ["profile", "traces/mixed.yaml", "--model", "qwen3-0.6b", "--limit", "3",
                                      "--block-size", "16", "--block-size", "32", "--offload", "--device", "cpu",
                                      "--repeat", "1", "--json", "-"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout[result.stdout.index("{"):])
    assert [(row["block_size"], row["layout"]) for row in document["offload"]] == [
        (16, "contiguous"), (16, "per-layer"), (32, "contiguous"), (32, "per-layer")]


def test_profile_offload_needs_a_device() -> None:
    result = CliRunner().invoke(app, ["profile", "traces/mixed.yaml", "--limit", "3", "--offload", "--device",
                                      "none"])
    assert result.exit_code == 2
    assert "--device" in result.output and "offloading needs a device" in result.output
