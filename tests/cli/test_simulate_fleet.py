"""``simulate``'s fleet options through the CLI: the table, the JSON, bad input (exit 2, one line)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from minipaged_cli.cli.main import app

runner = CliRunner()
FLEETS = sorted(Path(__file__).parents[2].joinpath("configs/fleets").glob("*.yaml"))


def test_replicas_table_and_json() -> None:
    result = runner.invoke(app, ["simulate", "traces/mixed.yaml", "--replicas", "3", "--router", "weighted",
                                 "--log-decisions", "--json", "-"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout[result.stdout.index("{"):])
    fleet = document["fleet"]
    assert len(fleet["replicas"]) == 3
    assert sum(r["num_requests"] for r in fleet["replicas"]) == 100
    assert fleet["completed_requests"] == 100
    assert [d["request"] for d in fleet["decisions"]] == list(range(100))
    assert all(len(d["scores"]) == 3 for d in fleet["decisions"])
    assert fleet["router"] == {"name": "weighted", "prefix_index": "precise",
                               "weights": {"prefix": 2.0, "queue": 1.0, "kv": 1.0}}


@pytest.mark.parametrize("path", FLEETS, ids=lambda p: p.stem)
def test_example_fleet_files_run(path: Path) -> None:
    extra = [] if "pd" in path.stem else ["--cpu-kv-memory", "64GiB"]
    result = runner.invoke(app, ["simulate", "traces/burst.yaml", "--fleet", str(path), *extra])
    assert result.exit_code == 0, result.output


BAD = [
    ("pools: [{name: a, replicas: 0}]", "pools.a.replicas: 0"),
    ("pools: [{role: prefill}, {role: decode}]\nkv_link: {bandwidth: 0GB/s}", "kv_link.bandwidth: '0GB/s'"),
    ("pools: [{role: prefill}, {role: decode}]\nkv_link: {bandwidth: .nan}", "kv_link.bandwidth: nan"),
    ("router: {name: fastest}\npools: [{replicas: 2}]", "router: 'fastest'"),
    ("router: {name: weighted, weights: {prefix: high}}\npools: [{replicas: 2}]", "router.weights.prefix: 'high'"),
    ("pools: [{role: prefill}, {role: decode, num_blocks: 10}]\nkv_link: {bandwidth: 50GB/s}",
     "pools.pool1.kv_memory: 160"),
    ("router: round-robin\nrouter: least-loaded\npools: [{replicas: 2}]", "line 2: router: duplicate key"),
]


@pytest.mark.parametrize(("text", "expected"), BAD, ids=[e for _, e in BAD])
def test_bad_fleet_files(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text(text)
    result = runner.invoke(app, ["simulate", "traces/burst.yaml", "--fleet", str(path), "--max-model-len", "4096",
                                 "--block-size", "16"])
    assert result.exit_code == 2, result.output
    line = result.stderr.strip()
    assert "\n" not in line and str(path) in line and expected in line, line


@pytest.mark.parametrize(("options", "expected"), [
    (["--replicas", "2", "--router", "nearest"], "router: 'nearest'"),
    (["--prefill-replicas", "1"], "--decode-replicas"),
    (["--prefill-replicas", "1", "--decode-replicas", "1", "--kv-link-bandwidth", "fast"], "--kv-link-bandwidth"),
    (["--replicas", "2", "--router-weights", "prefix=2"], "--router-weights"),
])
def test_bad_fleet_options(options: list[str], expected: str) -> None:
    result = runner.invoke(app, ["simulate", "traces/burst.yaml", *options])
    assert result.exit_code == 2, result.output
    assert expected in result.stderr and "\n" not in result.stderr.strip()


def test_sweep_takes_replicas_and_routers_as_axes() -> None:
    """3 routers x 2 fleet sizes (+ the engine alone), each point a replay as any other; a fleet point's row is
    the fleet's totals."""
    result = runner.invoke(app, ["sweep", "traces/burst.yaml", "--rates", "4", "--strategies", "paged",
                                 "--replicas", "1,2,3", "--routers", "round-robin,least-loaded,prefix-aware",
                                 "--workers", "1", "--json", "-"])
    assert result.exit_code == 0, result.output
    points = json.loads(result.stdout[result.stdout.index("{"):])["points"]
    fleets = sorted((n, r) for n in (2, 3) for r in ("least-loaded", "prefix-aware", "round-robin"))
    assert sorted((p["replicas"], p["router"]) for p in points) == [(1, ""), *fleets]
    assert all(p["completed_requests"] == 12 for p in points)


def test_fleet_plot(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    path = tmp_path / "fleet.png"
    result = runner.invoke(app, ["simulate", "traces/mixed.yaml", "--replicas", "3", "--plot", str(path)])
    assert result.exit_code == 0, result.output
    assert path.read_bytes()[:4] == b"\x89PNG"


def test_fleet_file_pools_have_their_own_engines(tmp_path: Path) -> None:
    path = tmp_path / "fleet.yaml"
    path.write_text("router: least-loaded\npools:\n  - {name: small, replicas: 2, num_blocks: 3000}\n"
                    "  - {name: big, replicas: 1, model: llama-3.1-8b, kv_memory: 16GiB}\n")
    result = runner.invoke(app, ["simulate", "traces/mixed.yaml", "--fleet", str(path), "--block-size", "16",
                                 "--json", "-"])
    assert result.exit_code == 0, result.output
    replicas = json.loads(result.stdout[result.stdout.index("{"):])["fleet"]["replicas"]
    assert [(r["model"], r["num_blocks"]) for r in replicas][:2] == [("qwen3-8b", 3000)] * 2
    assert replicas[2]["model"] == "llama-3.1-8b"
    assert replicas[2]["num_blocks"] == 16 * 2**30 // (16 * 131_072)  # 128 KiB/token: 32 layers x 8 x 128 x 2 x 2


@pytest.mark.parametrize(("args", "clients"), [(["tests/data/sessions_chat.yaml"], "open"),
                                               (["traces/mixed.yaml", "--concurrency", "3"], "closed"),
                                               (["tests/data/sessions_chat.yaml", "--max-concurrency", "2"], "capped")])
def test_a_fleet_runs_sessions_and_clients(args: list[str], clients: str) -> None:
    result = runner.invoke(app, ["simulate", *args, "--replicas", "2", "--router", "session-affinity", "--json", "-"])
    assert result.exit_code == 0, result.output
    fleet = json.loads(result.stdout[result.stdout.index("{"):])["fleet"]
    assert fleet["router"] == {"name": "session-affinity"}
    assert fleet["sessions"]["clients"] == clients
    assert fleet["sessions"]["turns_completed"] + fleet["sessions"]["turns_rejected"] <= fleet["completed_requests"] \
        + fleet["rejected_requests"]
    assert "Sessions, " + clients in result.stderr  # (the tables go to stderr when the JSON takes stdout)


def test_the_weighted_router_takes_a_session_weight() -> None:
    result = runner.invoke(app, ["simulate", "tests/data/sessions_chat.yaml", "--replicas", "2", "--router",
                                 "weighted", "--router-weights", "prefix:2,queue:1,session:4", "--json", "-"])
    assert result.exit_code == 0, result.output
    router = json.loads(result.stdout[result.stdout.index("{"):])["fleet"]["router"]
    assert router["weights"] == {"prefix": 2.0, "queue": 1.0, "session": 4.0}
    result = runner.invoke(app, ["simulate", "tests/data/sessions_chat.yaml", "--replicas", "2", "--router",
                                 "weighted", "--router-weights", "sesion:4"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "weights: 'sesion': unknown scorer (did you mean 'session'?)" in result.stderr


def test_a_fleet_file_routes_sessions_with_a_session_weight() -> None:
    result = runner.invoke(app, ["simulate", "tests/data/sessions_chat.yaml", "--fleet",
                                 "configs/fleets/session-weighted-4.yaml", "--concurrency", "4", "--json", "-"])
    assert result.exit_code == 0, result.output
    fleet = json.loads(result.stdout[result.stdout.index("{"):])["fleet"]
    assert fleet["router"]["weights"] == {"prefix": 2.0, "queue": 1.0, "kv": 1.0, "session": 3.0}
    assert fleet["sessions"]["clients"] == "closed" and fleet["sessions"]["max_in_flight"] <= 4
