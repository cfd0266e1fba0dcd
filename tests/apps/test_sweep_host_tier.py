"""sweep's host-tier axes (--cpu-kv-memory, --offload-policy, --tier-eviction): each point replays with its own
tier, the rows carry the GPU's and the tier's hits, a hand-worked trace gets the hits a hand count says, bad
values are one line, and --plot draws hit rate and TTFT against the host size (Mooncake's Fig. 9)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

import minipaged_cli.cli.sweep as sweep_cli
from minipaged_cli.apps.sweep import Axes, sweep
from minipaged_cli.apps.sweep_points import Settings, prepare
from minipaged_cli.apps.sweep_runners import LocalRunner
from minipaged_cli.cli.main import app
from minipaged_cli.workloads.readers import load_trace

runner = CliRunner()
QWEN3_8B_BYTES_PER_TOKEN = 36 * 2 * 8 * 128 * 2  # layers x (K, V) x KV heads x head dim x bf16 bytes
BLOCK = 16
GPU_BLOCKS = 129


def alternating_trace(tmp_path: Path) -> Path:
    """A, B, A, B: two 2048-token prompts (four 512-token hash blocks each, none shared between them), twice."""
    rows = [{"timestamp": i, "input_length": 2048, "output_length": 16,
             "hash_ids": [1, 2, 3, 4] if i % 2 == 0 else [5, 6, 7, 8]} for i in range(4)]
    path = tmp_path / "abab.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def abab_sweep(tmp_path: Path, **axes: Any) -> Any:
    # Room on the GPU for one request exactly (2,064 tokens = 129 blocks of 16): B's prompt evicts A's cached
    # blocks and A's second turn B's, so the GPU alone never hits. A low rate: each request finishes before the
    # next arrives (mean gap 1,000 s).
    gpu_kv = f"{GPU_BLOCKS * BLOCK * QWEN3_8B_BYTES_PER_TOKEN}"
    trace = load_trace(alternating_trace(tmp_path))
    return sweep(trace, Axes(rates=(0.001,), strategies=("paged",), kv_memory=(gpu_kv,), prefix_caching=(True,),
                             block_sizes=(BLOCK,), **axes),
                 Settings(engine={"max_model_len": 4096}), LocalRunner(1))


def test_host_sizes_are_points_each_with_its_tier(tmp_path: Path) -> None:
    axes = Axes(rates=(1.0,), strategies=("paged",), prefix_caching=(True,), cpu_kv_memory=("0", "1GiB"),
                tier_evictions=("lru", "arc"), block_sizes=(BLOCK,))
    points = axes.points()
    assert sorted((p.cpu_kv_memory, p.tier_eviction) for p in points) == \
        [("0", "arc"), ("0", "lru"), ("1GiB", "arc"), ("1GiB", "lru")]
    work = prepare(load_trace(alternating_trace(tmp_path)), Settings(engine={"max_model_len": 4096}), points)
    blocks = {p.cpu_kv_memory: work.configs[p.curve].tiers.cpu_kv_blocks for p in points}
    assert blocks == {"0": 0, "1GiB": 2**30 // (BLOCK * QWEN3_8B_BYTES_PER_TOKEN)}  # 455 blocks of 2.25 MiB
    assert {work.configs[p.curve].tiers.tier_eviction for p in points} == {"lru", "arc"}


def test_a_host_tier_turns_the_evicted_turns_into_hits(tmp_path: Path) -> None:
    result = abab_sweep(tmp_path, cpu_kv_memory=("0", "1GiB"))
    rows = {p.cpu_kv_memory: row for p, row in result.rows.items()}
    # Without a host tier nothing is found: each prompt's blocks were evicted by the other's.
    assert (rows["0"]["prefix_cache_hit_pct"], rows["0"]["tier_hit_pct"]) == (0.0, 0.0)
    # With one (455 blocks: both prompts' 256), A's and B's second turns load from it all their full 16-token
    # blocks but the last, whose final token is computed anyway: 127 blocks = 2,032 tokens each, of 4 x 2,048.
    assert rows["1GiB"]["prefix_cache_hit_pct"] == 0.0
    assert rows["1GiB"]["tier_hit_pct"] == pytest.approx(100 * 2 * 2032 / (4 * 2048))
    # Loading 2,032 tokens (300 MB) over the host link beats recomputing them: the first token comes sooner.
    assert rows["1GiB"]["ttft_mean_s"] < rows["0"]["ttft_mean_s"]


def test_the_plot_draws_one_curve_per_policy_against_the_host_sizes(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    from minipaged_cli.cli import plot

    drawn: list[Any] = []
    monkeypatch.setattr(plot, "_save", lambda figure, path, plt, field="--plot": drawn.append(figure))
    result = abab_sweep(tmp_path, cpu_kv_memory=("1GiB", "0"), tier_evictions=("lru", "arc"))
    plot.plot_host_tier(result, tmp_path / "f.png", title="t", reference={"0": 0.0, "1GiB": 50.0})
    (figure,) = drawn
    hits, ttft = figure.axes
    assert [label.get_text() for label in hits.get_xticklabels()] == ["0", "1GiB"]  # by size, not as written
    solid = {line.get_label(): list(line.get_ydata()) for line in hits.lines if line.get_linestyle() == "-"}
    expected = [0.0, pytest.approx(100 * 2 * 2032 / (4 * 2048))]
    assert solid == {"write-through, arc": expected, "write-through, lru": expected}
    reference = [line for line in hits.lines if line.get_label().startswith("plain LRU")]
    assert [list(line.get_ydata()) for line in reference] == [[0.0, 50.0]]
    assert len(ttft.lines) == 2


def test_the_command_plots_and_tabulates_the_host_axis(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    png = tmp_path / "fig9.png"
    gpu_kv = f"{GPU_BLOCKS * BLOCK * QWEN3_8B_BYTES_PER_TOKEN}"
    result = runner.invoke(app, ["sweep", str(alternating_trace(tmp_path)), "--strategies", "paged", "--rates",
                                 "0.001", "--kv-memory", gpu_kv, "--max-model-len", "4096", "--workers", "1",
                                 "--cpu-kv-memory", "0,1GiB", "--block-sizes", str(BLOCK), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    assert png.stat().st_size > 0
    assert "hit % GPU+host" in result.output and "0.0+49.6" in result.output


@pytest.fixture
def no_sweep(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the sweep ran before the bad input was refused")

    monkeypatch.setattr(sweep_cli, "sweep", refuse)


@pytest.mark.parametrize(("args", "message"), [
    (["--cpu-kv-memory", "0,-5GiB"], "error: --cpu-kv-memory: '-5GiB': expected a size"),
    (["--cpu-kv-memory", "lots"], "error: --cpu-kv-memory: 'lots': expected a size"),
    (["--cpu-kv-memory", "64GiB,64GiB"], "error: --cpu-kv-memory: '64GiB,64GiB': values must be distinct"),
    (["--tier-eviction", "lru,mru"], "error: --tier-eviction: 'mru': expected one of lru, arc"),
    (["--offload-policy", "write-back"], "error: --offload-policy: 'write-back': expected one of write-through"),
    (["--cpu-kv-memory", "1GiB", "--prefix-caching", "off"], "error: --cpu-kv-memory: the host tier holds prefix"),
])
def test_bad_host_tier_values_are_one_line(tmp_path: Path, no_sweep: None, args: list[str], message: str) -> None:
    result = runner.invoke(app, ["sweep", str(alternating_trace(tmp_path)), "--strategies", "paged", "--rates", "1",
                                 "--workers", "1", *args])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert result.output.startswith(message), result.output


def test_a_bad_host_size_in_a_config_file_names_the_file(tmp_path: Path, no_sweep: None) -> None:
    config = tmp_path / "sweep.yaml"
    config.write_text("rates: [1]\nstrategies: [paged]\ncpu_kv_memory: [0, 1 lot]\n")
    result = runner.invoke(app, ["sweep", str(alternating_trace(tmp_path)), "--workers", "1", "--config",
                                 str(config)])
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: {config}: cpu_kv_memory: '1 lot': expected a size"), result.output


def test_points_without_a_host_tier_share_one_replay(monkeypatch: pytest.MonkeyPatch) -> None:
    # --cpu-kv-memory 0,1GiB crossed with both policies and both inclusions: 3 combinations exist (exclusive needs
    # on-eviction); without a host tier they change nothing, so the 0 points share one replay: 1 + 3 per rate, 2
    # seeds each. The reference: the same sweep with every point replayed on its own, an SLO search included.
    from minipaged_cli.apps.sweep import Axes, Settings, parse_slo, sweep
    from minipaged_cli.apps.sweep_points import Point
    from minipaged_cli.apps.sweep_runners import LocalRunner
    from minipaged_cli.workloads.readers import load_trace
    from tests.cli.test_bad_input_scheduling import BURST

    axes = Axes(strategies=("paged",), rates=(1.0, 4.0), prefix_caching=(True,), cpu_kv_memory=("0", "1GiB"),
                offload_policies=("write-through", "on-eviction"), tier_inclusions=("inclusive", "exclusive"))

    def swept() -> tuple[dict, list[int]]:
        totals: list[int] = []
        result = sweep(load_trace(BURST), axes, Settings(seeds=2), LocalRunner(1), slos=(parse_slo("ttft-p99=0.1"),),
                       search_steps=2, progress=lambda done, total: totals.append(total))
        return result.to_dict(), totals

    shared, shared_totals = swept()
    assert shared_totals[:2 * 4 * 2] == [2 * 4 * 2] * (2 * 4 * 2)  # the first round: 2 rates x 4 replays x 2 seeds
    monkeypatch.setattr(Point, "replay_key", property(lambda point: point))
    alone, alone_totals = swept()
    assert alone_totals[0] == 2 * 6 * 2 and len(alone_totals) > len(shared_totals)
    assert shared == alone
