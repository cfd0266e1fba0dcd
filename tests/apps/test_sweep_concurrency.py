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


def test_max_concurrency_is_an_axis_and_a_cap_above_every_request_is_the_open_loop() -> None:
    runner = CliRunner()
    base = ["sweep", str(CHAT), "--rates", "2,8", "--strategies", "paged", "--workers", "1", "--json", "-"]
    result = runner.invoke(app, [*base, "--max-concurrency", "1,1000"])
    assert result.exit_code == 0, result.output
    rows = {(p["max_concurrency"], p["rate"]): p for p in json.loads(result.stdout)["points"]}
    assert sorted(rows) == [(1, 2.0), (1, 8.0), (1000, 2.0), (1000, 8.0)]
    open_loop = runner.invoke(app, base)
    for point in json.loads(open_loop.stdout)["points"]:  # (1,000 in flight: more than the trace's 94 requests)
        capped = rows[(1000, point["rate"])]
        assert {k: v for k, v in capped.items() if k != "max_concurrency"} == \
            {k: v for k, v in point.items() if k != "max_concurrency"}
        # one at a time: no batch of two, and the output comes slower than with no cap
        assert rows[(1, point["rate"])]["mean_batch_size"] == 1.0
        assert rows[(1, point["rate"])]["throughput_tokens_per_s"] < point["throughput_tokens_per_s"]


def test_concurrency_and_max_concurrency_are_not_swept_together() -> None:
    result = CliRunner().invoke(app, ["sweep", str(CHAT), "--concurrency", "1", "--max-concurrency", "2",
                                      "--strategies", "paged"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "--max-concurrency: '2': sweep --concurrency (closed loop) or --max-concurrency" in result.stderr


def test_sweep_and_convert_take_a_tokenizer_directory(tmp_path: Path) -> None:
    # As simulate does: a directory that is not there is one line naming --tokenizer, before anything runs.
    missing = tmp_path / "missing"
    for args in (["sweep", str(CHAT), "--rates", "1", "--strategies", "paged"],
                 ["convert", str(CHAT), str(tmp_path / "out.yaml")]):
        result = CliRunner().invoke(app, [*args, "--tokenizer", str(missing)])
        assert result.exit_code == 2 and result.stderr.count("\n") == 1, (args, result.output)
        assert "--tokenizer" in result.stderr


def test_a_fleet_point_runs_its_clients() -> None:
    # Its row is simulate's fleet over the same clients: one closed-loop client, one request at a time.
    runner = CliRunner()
    result = runner.invoke(app, ["sweep", str(CHAT), "--concurrency", "1", "--replicas", "2", "--routers",
                                 "session-affinity", "--strategies", "paged", "--workers", "1", "--json", "-"])
    assert result.exit_code == 0, result.output
    row = next(p for p in json.loads(result.stdout)["points"] if p["replicas"] == 2)
    simulated = runner.invoke(app, ["simulate", str(CHAT), "--concurrency", "1", "--replicas", "2", "--router",
                                    "session-affinity", "--json", "-"])
    fleet = json.loads(simulated.stdout[simulated.stdout.index("{"):])["fleet"]
    assert fleet["max_batch_size"] == 1 and row["mean_batch_size"] == fleet["mean_batch_size"]
    assert row["throughput_tokens_per_s"] == pytest.approx(fleet["throughput_tokens_per_s"], rel=1e-6)
