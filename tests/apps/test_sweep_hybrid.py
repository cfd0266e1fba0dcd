"""The README's hybrid-manager figures: vLLM's KV size for gpt-oss-120b and Gemma 3 27B worked by hand from the
layer counts, window, block size and KV dtype against the sweep's configurations, and ``sweep`` showing the paged
curve with every layer as full attention beside the hybrid manager's, as its --hybrid-kv help says."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from minipaged_cli.apps.sweep import Axes, sweep
from minipaged_cli.apps.sweep_points import Point, Settings, all_full_attention_models, prepare
from minipaged_cli.apps.sweep_runners import LocalRunner
from minipaged_cli.cli.main import app
from minipaged_cli.sim.replay import simulate
from minipaged_cli.workloads.readers import load_trace
from tests.conftest import ROOT

runner = CliRunner()
MIXED = ROOT / "traces" / "mixed.yaml"
GIB = 2**30


def vllm_kv_size(num_blocks: int, block_size: int, max_model_len: int, num_full: int, num_sliding: int,
                 window: int, step_tokens: int = 8192) -> int:
    """vLLM 0.33.0's "KV cache size: N tokens" (kv_cache_utils.get_kv_cache_capacity), written out: a request of
    max_model_len takes ceil(len / B) blocks in each full group and, in each sliding group, the blocks that
    SlidingWindowSpec.max_memory_usage_bytes counts: ceil(min(window - 1 + one step's tokens, len) / B) + 1."""
    sliding = math.ceil(min(window - 1 + step_tokens, max_model_len) / block_size) + 1
    per_request = num_full * math.ceil(max_model_len / block_size) + num_sliding * sliding
    return int(num_blocks / per_request * max_model_len)


# (model, KV memory in GiB, max_model_len, KV dtype bytes, blocks with the hybrid manager, with every layer full,
#  full groups, sliding groups, window, vLLM's KV size in tokens with the manager / every layer full: the README's
#  figures). A group's page of 16 tokens: layers x K and V x KV heads x head_dim x dtype bytes x 16. gpt-oss-120b:
# 2 groups of 18 layers, 8 KV heads of 64; Gemma 3 27B: 52 sliding + 10 full layers -> 7 groups of 10 (the sliding
# ones padded), 16 KV heads of 128; every layer full: one page of all of them.
CASES = [
    ("gpt-oss-120b", 2, 32768, 2, 2 * GIB // (18 * 2 * 8 * 64 * 2 * 16), 2 * GIB // (36 * 2 * 8 * 64 * 2 * 16),
     1, 1, 128, 46_428, 29_120),
    ("gpt-oss-120b", 2, 32768, 1, 2 * GIB // (18 * 2 * 8 * 64 * 1 * 16), 2 * GIB // (36 * 2 * 8 * 64 * 1 * 16),
     1, 1, 128, 92_870, 58_240),
    ("gemma-3-27b", 16, 16384, 2, 16 * GIB // (10 * 2 * 16 * 128 * 2 * 16), 16 * GIB // (62 * 2 * 16 * 128 * 2 * 16),
     1, 6, 1024, 47_870, 33_824),
    ("gemma-3-27b", 16, 16384, 1, 16 * GIB // (10 * 2 * 16 * 128 * 1 * 16), 16 * GIB // (62 * 2 * 16 * 128 * 1 * 16),
     1, 6, 1024, 95_740, 67_648),
]


@pytest.mark.parametrize(("model", "gib", "model_len", "dtype_bytes", "hybrid_blocks", "full_blocks", "num_full",
                          "num_sliding", "window", "hybrid_tokens", "full_tokens"), CASES)
def test_the_kv_size_of_each_curve_is_vllms_worked_by_hand(model: str, gib: int, model_len: int, dtype_bytes: int,
                                                           hybrid_blocks: int, full_blocks: int, num_full: int,
                                                           num_sliding: int, window: int, hybrid_tokens: int,
                                                           full_tokens: int) -> None:
    assert vllm_kv_size(hybrid_blocks, 16, model_len, num_full, num_sliding, window) == hybrid_tokens
    assert full_blocks * 16 == full_tokens  # a full-attention request of max_model_len takes max_model_len slots
    trace = load_trace(MIXED, "auto")
    settings = Settings(kv_cache_dtype="auto" if dtype_bytes == 2 else "fp8_e4m3", engine={"max_model_len": model_len})
    hybrid = Point(model, "h200", f"{gib}GiB", 16, True, "paged", 1.0)
    full = Point(model, "h200", f"{gib}GiB", 16, True, "paged-all-full", 1.0)
    configs = prepare(trace, settings, [hybrid, full]).configs
    assert (configs[hybrid.curve].cache.num_blocks, configs[hybrid.curve].kv_size_tokens) == \
        (hybrid_blocks, hybrid_tokens)
    # The all-full curve holds the hybrid pool's bytes (as simulate's paged_all_full_attention) in pages of every layer.
    assert (configs[full.curve].cache.num_blocks, configs[full.curve].kv_size_tokens) == (full_blocks, full_tokens)


def _sweep_json(*args: str) -> dict:
    result = runner.invoke(app, ["sweep", str(MIXED), "--model", "gpt-oss-20b", "--kv-memory", "48MiB",
                                 "--max-model-len", "8192", "--rates", "8", "--workers", "1", "--block-sizes", "16",
                                 "--json", "-", *args])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout[result.stdout.index("{"):])


def test_sweep_shows_paged_with_every_layer_full_beside_the_hybrid_manager() -> None:
    document = _sweep_json("--strategies", "paged,oracle-reserve", "--slo", "normalized-latency=0.05")
    rows = {point["strategy"]: point for point in document["points"] if point["rate"] == 8}
    assert set(rows) == {"paged", "oracle-reserve", "paged-all-full"}
    # The reference: simulate's own replay of paged with every layer full on the same memory and arrivals.
    trace = load_trace(MIXED, "auto", rate=8, seed=0)
    work = prepare(trace, Settings(engine={"max_model_len": 8192}), [Point("gpt-oss-20b", "h200", "48MiB", 16, True,
                                                                             "paged", 8.0)])
    config = next(iter(work.configs.values()))
    result = simulate(trace, config, ("paged",))
    assert result.all_full_attention is not None
    full = result.all_full_attention[1]
    assert rows["paged-all-full"]["num_preemptions"] == full.num_preemptions
    assert rows["paged-all-full"]["completed_requests"] == full.completed_requests
    assert rows["paged-all-full"]["mean_batch_size"] == pytest.approx(full.mean_batch_size, rel=1e-6)
    assert rows["paged-all-full"]["token_state_pct"] == pytest.approx(full.token_state_pct, rel=1e-4)
    paged = result.strategies["paged"]
    assert rows["paged"]["mean_batch_size"] == pytest.approx(paged.mean_batch_size, rel=1e-6)
    # Its capacity is searched like any curve, and paged's is divided by it.
    assert {c["strategy"] for c in document["capacity"]} == {"paged", "oracle-reserve", "paged-all-full"}
    assert "paged-all-full" in document["ratios"][0]["paged_over"]


@pytest.mark.parametrize("args", [["--no-hybrid-kv"], ["--strategies", "oracle-reserve"]])
def test_no_all_full_curve_without_the_hybrid_manager_or_paged(args: list[str]) -> None:
    document = _sweep_json(*(args if "--strategies" in args else ["--strategies", "paged", *args]))
    assert "paged-all-full" not in {point["strategy"] for point in document["points"]}


def test_the_sweep_plot_draws_the_all_full_curve(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    from minipaged_cli.cli import plot

    drawn: list[Any] = []
    monkeypatch.setattr(plot, "_save", lambda figure, path, plt, field="--plot": drawn.append(figure))
    settings = Settings(engine={"max_model_len": 8192})
    axes = Axes(rates=(4.0, 8.0), strategies=("paged",), models=("gpt-oss-20b",), kv_memory=("48MiB",),
                all_full_models=all_full_attention_models(("gpt-oss-20b",), ("paged",), settings))
    plot.plot_sweep(sweep(load_trace(MIXED, "auto"), axes, settings, LocalRunner(1)), tmp_path / "s.png", title="t")
    (figure,) = drawn
    (ax,) = figure.axes
    assert [line.get_label() for line in ax.get_lines()] == ["paged", "paged-all-full"]
