"""``simulate`` with sessions and clients: the options, the sessions table, ``--json``'s ``sessions`` object (today's
fields kept), and the options' mistakes refused with one line."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from minipaged_cli.cli.main import app
from tests.conftest import ROOT

runner = CliRunner()
CHAT = ROOT / "tests" / "data" / "sessions_chat.yaml"
MIXED = ROOT / "traces" / "mixed.yaml"


def simulate(*args: str) -> dict:
    result = runner.invoke(app, ["simulate", *args, "--strategies", "paged", "--json", "-"])
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["strategies"]["paged"]


def test_json_adds_sessions_and_keeps_today_s_fields() -> None:
    plain = simulate(str(MIXED))
    assert "sessions" not in plain  # open loop, no sessions: today's document
    capped = simulate(str(MIXED), "--max-concurrency", "10000")
    assert {k: v for k, v in capped.items() if k != "sessions"} == plain
    chat = simulate(str(CHAT), "--concurrency", "4")["sessions"]
    assert chat["clients"] == "closed" and chat["concurrency"] == 4
    assert chat["completed_sessions"] == chat["num_sessions"] == 20
    assert chat["max_in_flight"] <= 4
    assert chat["hit_pct_later_turns"] > chat["hit_pct_first_turn"]


def test_the_sessions_table_is_printed() -> None:
    result = runner.invoke(app, ["simulate", str(CHAT), "--strategies", "paged", "--max-concurrency", "4"])
    assert result.exit_code == 0, result.output
    assert "Sessions, capped (4) clients" in result.stdout and "hit % later turns" in result.stdout


@pytest.mark.parametrize(("options", "message"), [
    (["--concurrency", "0"], "--concurrency: 0: must be a whole number >= 1"),
    (["--concurrency", "2", "--max-concurrency", "3"], "not both"),
    (["--clients", "closed"], "--clients: 'closed': closed clients take --concurrency N"),
    (["--clients", "shut"], "--clients: 'shut': expected one of open, closed, capped"),
])
def test_bad_client_options_exit_2_with_one_line(options: list[str], message: str) -> None:
    result = runner.invoke(app, ["simulate", str(MIXED), "--strategies", "paged", *options])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], lines
