"""The session-routing study's script (``benchmarks/session_routing.py``) on a tiny slice of its workload: the
page names every router with the command of its row, and a row's figures are what that command prints."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path

from typer.testing import CliRunner

from minipaged_cli.cli.main import app

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))
import session_routing  # noqa: E402


def test_the_page_holds_each_router_and_a_row_is_its_command(tmp_path: Path) -> None:
    text = session_routing.page(session_routing.TRACE, 24)
    assert text.startswith("# Session affinity against prefix-aware routing")
    assert "Written by `python benchmarks/session_routing.py --limit 24`" in text
    rows = [line for line in text.splitlines() if line.startswith("| ") and "`minipaged simulate" in line]
    assert len(rows) == 2 * len(session_routing.ROUTERS)
    assert [row.split(" | ")[0][2:] for row in rows] == [name for name, _ in session_routing.ROUTERS] * 2
    # The session-affinity row of the closed loop, by its own command (its later-turn hit % and turns/s)
    row = next(r for r in rows if r.startswith("| session-affinity |") and "--concurrency" in r)
    command = shlex.split(row.rsplit("`", 2)[1])
    assert command[:3] == ["minipaged", "simulate", "traces/chat_sessions.yaml"]
    path = tmp_path / "row.json"
    result = CliRunner().invoke(app, [*command[1:], "--json", str(path)])
    assert result.exit_code == 0, result.output
    sessions = json.loads(path.read_text())["fleet"]["sessions"]
    cells = row.split(" | ")
    assert cells[2] == f"{sessions['hit_pct_later_turns']:.1f}" and cells[6] == f"{sessions['turns_per_s']:.2f}"
