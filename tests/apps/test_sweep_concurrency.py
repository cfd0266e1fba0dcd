"""``sweep --concurrency``: closed-loop clients as an axis; each value one replay (arrival times are not used), its
row what ``simulate --concurrency`` measures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from minipaged_cli.apps.sweep import Axes
from minipaged_cli.cli.main import app
from tests.conftest import ROOT

CHAT = ROOT / "tests" / "data" / "sessions_chat.yaml"


def test_concurrency_is_an_axis_and_rates_share_a_closed_loop_replay() -> None:
    axes = Axes(rates=(1.0, 2.0), strategies=("paged",), concurrency=(1, 8))
    points = axes.points()
    assert sorted({(p.concurrency, p.rate) for p in points}) == [(1, 1.0), (1, 2.0), (8, 1.0), (8, 2.0)]
    assert len({p.replay_key for p in points}) == 2
    assert "concurrency" in axes.varying()


def test_sweep_rows_are_simulate_s_numbers_at_each_concurrency() -> None:
    runner = CliRunner()
    result = runner.invoke(app, ["sweep", str(CHAT), "--concurrency", "1,4", "--strategies", "paged", "--workers",
                                 "1", "--json", "-"])
    assert result.exit_code == 0, result.output
    rows = {p["concurrency"]: p for p in json.loads(result.stdout)["points"]}
    assert sorted(rows) == [1, 4]
    for concurrency, row in rows.items():
        simulated = runner.invoke(app, ["simulate", str(CHAT), "--strategies", "paged", "--concurrency",
                                        str(concurrency), "--json", "-"])
        paged = json.loads(simulated.stdout)["strategies"]["paged"]
        assert row["throughput_tokens_per_s"] == pytest.approx(paged["throughput_tokens_per_s"], rel=1e-6)
        assert row["ttft_mean_s"] == pytest.approx(paged["mean_ttft_s"], rel=1e-6)
    assert rows[4]["throughput_tokens_per_s"] > rows[1]["throughput_tokens_per_s"]


def test_a_bad_concurrency_is_one_line() -> None:
    result = CliRunner().invoke(app, ["sweep", str(CHAT), "--concurrency", "1,0", "--strategies", "paged"])
    assert result.exit_code == 2
    assert "--concurrency: 0: must be >= 1" in result.stderr


def test_the_plot_draws_latency_against_throughput(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    plot = tmp_path / "clients.png"
    result = CliRunner().invoke(app, ["sweep", str(CHAT), "--concurrency", "1,4", "--strategies", "paged",
                                      "--workers", "1", "--plot", str(plot)])
    assert result.exit_code == 0, result.output
    assert plot.stat().st_size > 10_000
