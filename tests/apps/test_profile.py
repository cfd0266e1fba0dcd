"""``minipaged profile``: numbers worked by hand, monotonic waste, prefix loss, the recommendation, the CLI."""

from __future__ import annotations

import json
from itertools import pairwise

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from minipaged_cli.apps.profile import (
    KernelCost,
    prefix_tokens_lost,
    profile_block_size,
    recommend,
    time_kernels,
)
from minipaged_cli.cli.main import app
from minipaged_cli.dataplane.backends import TorchBackend
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.workloads.presets import GpuSpec, ModelSpec
from minipaged_cli.workloads.trace import Request, make_trace
from tests.conftest import ROOT

MODEL = ModelSpec(name="small", num_layers=1, hidden_size=64, intermediate_size=64, num_q_heads=4, num_kv_heads=2,
                  head_dim=16, vocab_size=64, tie_word_embeddings=True, gated_mlp=True, dtype="float32",
                  max_model_len=4096)
GPU = GpuSpec(name="clock", memory_bytes=1e12, hbm_bandwidth_bytes_per_s=1e30, peak_flops=1e30,
              step_overhead_s=0.001)
AMPLE = 1 << 30  # KV bytes: no memory pressure at any block size


def config() -> SimConfig:
    return SimConfig.of(MODEL, GPU, num_blocks=1024, block_size=16, max_model_len=4096)


def test_lengths_10_17_32_by_hand() -> None:
    # Each request holds prompt tokens only (output 1: the prefill samples it) and runs alone for one step.
    trace = make_trace("hand", [Request("a", 0.0, 10, 1), Request("b", 1.0, 17, 1), Request("c", 2.0, 32, 1)],
                       source="test")
    expected = {
        # block: (tail waste per request, allocated slots per request, blocks per request)
        4: ((2, 3, 0), (12, 20, 32), (3, 5, 8)),
        8: ((6, 7, 0), (16, 24, 32), (2, 3, 4)),
        16: ((6, 15, 0), (16, 32, 32), (1, 2, 2)),
    }
    for block_size, (waste, allocated, blocks) in expected.items():
        row = profile_block_size(trace, config(), block_size, AMPLE)
        # equal step durations: time weighting is a plain mean over the three one-step lives
        assert row.mean_tail_waste_tokens == pytest.approx(sum(waste) / 3), block_size
        assert row.tail_waste_pct == pytest.approx(100 * sum(waste) / sum(allocated)), block_size
        assert row.num_block_allocations == row.num_block_frees == sum(blocks)
        assert row.block_table_entries_per_sequence == pytest.approx(sum(blocks) / 3)
        assert row.block_table_bytes == 4 * max(blocks)  # the peak: one request at a time
        assert sorted(row.final_tail_waste) == sorted(waste)
    assert profile_block_size(trace, config(), 4, AMPLE).tail_waste_pct == pytest.approx(100 * 5 / 64)


def test_tail_waste_never_decreases_with_block_size() -> None:
    rng = np.random.default_rng(0)
    requests = [Request(f"r{i}", float(rng.uniform(0, 2)), int(rng.integers(1, 3000)), int(rng.integers(1, 400)))
                for i in range(60)]
    trace = make_trace("random", requests, source="test")
    rows = [profile_block_size(trace, config(), 2 ** k, AMPLE) for k in range(8)]
    fragmentation = [r.tail_waste_pct for r in rows]
    waste = [r.mean_tail_waste_tokens for r in rows]
    # (-L) mod 2B >= (-L) mod B for every L, and the schedule is the same at every size (no memory pressure)
    assert all(later >= earlier - 1e-9 for earlier, later in pairwise(fragmentation))
    assert all(later >= earlier - 1e-9 for earlier, later in pairwise(waste))
    assert fragmentation[0] == pytest.approx(0.0, abs=1e-9) and fragmentation[-1] > fragmentation[3] > 0
    # random lengths spread evenly modulo B: the mean tail waste is close to (B - 1) / 2
    for row in rows[3:]:
        assert row.mean_tail_waste_tokens == pytest.approx(row.expected_tail_waste_tokens, rel=0.2)


def test_prefix_loss_by_hand() -> None:
    segments = {"sys": 100, "tools": 28}
    requests = [Request("a", 0.0, 300, 5, ("sys",)), Request("b", 1.0, 200, 5, ("sys",)),
                Request("c", 2.0, 400, 5, ("sys", "tools")), Request("d", 3.0, 400, 5, ("sys", "tools")),
                Request("e", 4.0, 50, 5)]
    trace = make_trace("p", requests, source="test", segments=segments)
    # b shares 100 tokens, c shares 100 (its "tools" is new), d shares 128: lost = 100%B + 100%B + 128%B
    for block_size in (1, 4, 16, 32, 64, 128, 256):
        assert prefix_tokens_lost(trace, block_size) == 2 * (100 % block_size) + 128 % block_size


def test_no_prefix_loss_when_shared_prefixes_are_whole_blocks() -> None:
    requests = [Request(f"r{i}", float(i), 600, 3, ("sys-a",) if i % 2 else ("sys-b", "few-shot"))
                for i in range(10)]
    trace = make_trace("p", requests, source="test", segments={"sys-a": 128, "sys-b": 256, "few-shot": 64})
    for block_size in (1, 2, 8, 16, 32, 64):
        assert prefix_tokens_lost(trace, block_size) == 0


def test_recommendation_prefers_speed_among_near_best_capacity() -> None:
    trace = make_trace("r", [Request("a", 0.0, 100, 10)], source="test")
    rows = [profile_block_size(trace, config(), b, AMPLE) for b in (8, 16, 32)]
    for row, attention_us in zip(rows, (300.0, 120.0, 150.0), strict=True):
        row.kernel = KernelCost(0.1, attention_us, 1.0, 1, 100)
    assert recommend(rows)[0] == 16
    rows[1].metrics.token_state_pct -= 5  # 16 loses capacity: no longer within a point of the best
    size, reason = recommend(rows)
    assert size == 32 and "fastest attention" in reason
    for row in rows:
        row.kernel = None
    assert recommend(rows)[0] == 32  # without timings: the largest qualifying size


def test_kernel_timing_counts_the_bytes_read() -> None:
    cost = time_kernels(TorchBackend(), config(), 16, [100, 37, 300], torch.float32, max_tokens=None, repeat=2)
    assert cost.batch == 3 and cost.tokens == 437
    kv_bytes = 2 * 437 * MODEL.num_kv_heads * MODEL.head_dim * 4
    assert cost.attention_gbps == pytest.approx(kv_bytes / (cost.attention_us * 1e-6) / 1e9)
    scaled = time_kernels(TorchBackend(), config(), 16, [1000, 3000], torch.float32, max_tokens=400, repeat=1)
    assert scaled.tokens == 100 + 300  # proportions kept


def test_profile_command_json() -> None:
    result = CliRunner().invoke(app, ["profile", str(ROOT / "traces" / "burst.yaml"), "--kv-memory", "1GiB",
                                      "--max-model-len", "4096", "--block-size", "8", "--block-size", "32",
                                      "--repeat", "1", "--json", "-"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert {"trace", "device", "backend", "rows"} <= set(document)
    assert [r["block_size"] for r in document["rows"]] == [8, 32]
    keys = {"block_size", "tail_waste_pct", "internal_frag_pct", "mean_tail_waste_tokens", "block_table_bytes",
            "num_block_allocations", "token_state_pct", "mean_batch_size", "num_preemptions", "prefix_tokens_lost",
            "cache_write_us_per_token", "attention_us", "attention_gbps"}
    assert all(set(r) == keys for r in document["rows"])
    assert document["rows"][0]["attention_us"] > 0
    assert "recommendation: block size" in result.stderr


def test_single_block_size_shows_its_detail() -> None:
    result = CliRunner().invoke(app, ["profile", str(ROOT / "traces" / "burst.yaml"), "--kv-memory", "1GiB",
                                      "--max-model-len", "4096", "--block-size", "16", "--device", "none"])
    assert result.exit_code == 0, result.output
    assert "Tail waste at completion" in result.stdout and "Where the KV memory goes" in result.stdout


def test_profile_bad_block_size() -> None:
    result = CliRunner().invoke(app, ["profile", "--block-size", "0", "--device", "none"])
    assert result.exit_code == 2 and "--block-size" in result.stderr


@pytest.mark.native_build
def test_kernel_timing_on_the_emulated_kernels() -> None:
    from dataclasses import replace

    from minipaged_cli.dataplane.emulation import EmulatedBackend

    backend = EmulatedBackend()
    assert backend.unsupported(MODEL.num_q_heads, MODEL.num_kv_heads, MODEL.head_dim) is not None  # head_dim 16
    kernel_model = replace(MODEL, head_dim=64)
    cost = time_kernels(backend, replace(config(), model=kernel_model), 16, [40, 9], torch.float32, max_tokens=2048,
                        repeat=1)
    assert cost.tokens == 49 and cost.attention_us > 0 and cost.cache_write_us_per_token > 0


def test_a_shape_the_kernels_do_not_cover_is_bad_input(tmp_path) -> None:
    config_path = tmp_path / "config.json"
    config_path.write_text(json.dumps({"hidden_size": 256, "intermediate_size": 512, "num_attention_heads": 8,
                                       "num_key_value_heads": 8, "head_dim": 32, "num_hidden_layers": 2,
                                       "vocab_size": 100, "max_position_embeddings": 4096}))
    result = CliRunner().invoke(app, ["profile", str(ROOT / "traces" / "burst.yaml"), "--model", str(config_path),
                                      "--kv-memory", "64MiB", "--device", "emulated"])
    assert result.exit_code == 2
    assert "the CUDA kernels cover head_dim 64 and 128, not 32" in result.stderr


def test_profile_and_simulate_mean_the_same_by_the_same_name() -> None:
    # One name, one meaning: profile's internal_frag_pct and token_state_pct are simulate's (Σ max(A - F, 0) and
    # Σ L, % of capacity); the whole tail (Σ (A - L), % of allocated slots) has a name of its own.
    options = [str(ROOT / "traces" / "burst.yaml"), "--kv-memory", "1GiB", "--max-model-len", "4096", "--json", "-"]
    profiled = CliRunner().invoke(app, ["profile", *options, "--block-size", "16", "--device", "none"])
    simulated = CliRunner().invoke(app, ["simulate", *options, "--block-size", "16", "--strategies", "paged"])
    assert profiled.exit_code == 0 and simulated.exit_code == 0, profiled.output + simulated.output
    row = json.loads(profiled.stdout)["rows"][0]
    paged = json.loads(simulated.stdout)["strategies"]["paged"]
    for key in ("internal_frag_pct", "token_state_pct", "num_preemptions", "mean_batch_size"):
        assert row[key] == paged[key], key
    assert row["tail_waste_pct"] > row["internal_frag_pct"]  # the tail includes what requests will still fill
