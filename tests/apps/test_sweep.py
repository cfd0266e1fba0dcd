"""minipaged sweep: normalized latency by hand, the capacity search on curves worked by hand and against direct
replays, seeds averaged, the same answers inline, in worker processes and on a Ray cluster, bad input, and the
memory-layout picture."""

from __future__ import annotations

import csv
import inspect
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from minipaged_cli.apps.sweep import Axes, Slo, SweepResult, lattice_index, lattice_rate, sweep
from minipaged_cli.apps.sweep_points import Point, Replay, Settings, Work, mean_row, prepare, run_replay
from minipaged_cli.apps.sweep_runners import LocalRunner, longest_first
from minipaged_cli.cli.main import app
from minipaged_cli.cli.sweep import capacity_notes, capacity_table
from minipaged_cli.memory.contiguous import OracleReserveAllocator
from minipaged_cli.memory.paged import PagedAllocator
from minipaged_cli.sim.config import CONCERNS, DEFAULT_BLOCK_SIZE, DEFAULT_GPU_MEMORY_UTILIZATION, SimConfig
from minipaged_cli.sim.replay import replay
from minipaged_cli.workloads.presets import GpuSpec, ModelSpec, load_gpu, load_model
from minipaged_cli.workloads.readers import load_trace
from tests.conftest import ROOT
from tests.sim.test_replay import trace_of

runner = CliRunner()
AZURE = str(ROOT / "traces" / "azure_conv_1k.yaml")
SMALL = ["--limit", "200", "--kv-memory", "4GiB", "--max-model-len", "8192"]


def test_normalized_latency_by_hand(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    # Every step lasts 1 ms. A (10 + 5 tokens) arrives at 0: prefill in step 1, decodes in steps 2-5, done at
    # 5 ms. B (4 + 2) arrives at 2.5 ms, is admitted at the step starting at 3 ms (prefill: first token at 4 ms)
    # and decodes its second token in step 5, done at 5 ms. Normalized: A 5 ms / 5 = 1 ms, B 2.5 ms / 2 = 1.25 ms.
    config = SimConfig.of(tiny_model, clock_gpu, num_blocks=10, block_size=4, max_model_len=20)
    metrics = replay(trace_of((0.0, 10, 5), (0.0025, 4, 2)), config, "paged")
    assert metrics.mean_normalized_latency_s == pytest.approx(0.001125)
    assert metrics.p99_normalized_latency_s == pytest.approx(0.001 + 0.99 * 0.00025)


def _points_and_capacity(document: dict) -> tuple[list, list]:
    return document["points"], document["capacity"]


def test_the_same_answers_inline_and_in_worker_processes() -> None:
    trace = load_trace(AZURE, limit=150)
    axes = Axes(rates=(1.0, 4.0), strategies=("paged", "max-reserve"), kv_memory=("2GiB",))
    settings = Settings(seeds=2, engine={"max_model_len": 8192})
    slos = (Slo("normalized-latency", 0.05),)
    inline = sweep(trace, axes, settings, LocalRunner(1), slos, search_steps=2)
    pooled = sweep(trace, axes, settings, LocalRunner(2), slos, search_steps=2)
    assert inline.to_dict() == pooled.to_dict()


def _point(curve: Point, rate: float) -> Point:
    return Point(**{**vars(curve), "rate": rate})


def test_the_capacity_search_brackets_the_rate_direct_replays_find() -> None:
    trace = load_trace(AZURE, limit=200)
    settings = Settings(engine={"max_model_len": 8192})
    axes = Axes(rates=(0.25, 1.0, 4.0), strategies=("max-reserve", "paged"), kv_memory=("2GiB",))
    slo = Slo("ttft-p99", 2.0)
    result = sweep(trace, axes, settings, LocalRunner(1), (slo,))
    work = prepare(trace, settings, axes.points())

    def met(point: Point) -> bool:  # independent of the search: a replay at that rate, looked at
        return slo.met_by(mean_row([run_replay(work, Replay(point, 0))]))

    for capacity in result.capacities or []:
        low, high = capacity.bracket
        if capacity.status == "found":
            assert met(_point(capacity.curve, low)) and not met(_point(capacity.curve, high))
            # Resolved to three significant digits: the bracket's ends are neighbours among such rates.
            assert capacity.rate == low and high == pytest.approx(low + 10 ** (np.floor(np.log10(low)) - 2))
        else:
            assert capacity.status == "above grid" and met(_point(capacity.curve, 4.0))
    by_strategy = {c.curve.strategy: c for c in result.capacities or []}
    # One request at a time (max-reserve holds a 8,192-token extent each in 2 GiB = 14,563 tokens) sustains less.
    assert by_strategy["max-reserve"].rate < by_strategy["paged"].rate


def test_three_digit_rates_round_trip_and_round_down_or_up() -> None:
    # Every three-digit rate over four decades, written as decimals (the reference): each maps to its own index,
    # the indices are consecutive, and the rate comes back exactly as written.
    decimals = [float(f"{mantissa}e{exponent}") for exponent in range(-4, 0) for mantissa in range(100, 1000)]
    indices = [lattice_index(rate) for rate in decimals]
    assert indices == list(range(indices[0], indices[0] + len(decimals)))
    assert [lattice_rate(i) for i in indices] == decimals
    assert [lattice_index(rate, round_up=True) for rate in decimals] == indices
    # Between them: pi rounds down to 3.14 and up to 3.15; just below 10, to 9.99 and 10.
    assert (lattice_rate(lattice_index(math.pi)), lattice_rate(lattice_index(math.pi, round_up=True))) == (3.14, 3.15)
    assert (lattice_rate(lattice_index(9.995)), lattice_rate(lattice_index(9.995, round_up=True))) == (9.99, 10.0)


class CurveRunner:
    """A runner whose replays are a latency curve given by a formula (``ttft_p99_s = latency(rate)``), so the
    search's answer can be worked by hand. It runs what the search asks, as the real runners do."""

    def __init__(self, latency: Any) -> None:
        self.latency = latency
        self.rates: list[float] = []

    def start(self, work: Work) -> None:
        pass

    def close(self) -> None:
        pass

    def run(self, jobs: list[Replay]) -> Any:
        for job in jobs:
            self.rates.append(job.point.rate)
            yield job, {"ttft_p99_s": float(self.latency(job.point.rate))}


def _capacity(latency: Any, rates: tuple[float, ...]) -> tuple[SweepResult, CurveRunner]:
    runner = CurveRunner(latency)
    result = sweep(trace_of((0.0, 10, 5)), Axes(rates=rates, strategies=("dynamic",)), Settings(), runner,
                   (Slo("ttft-p99", 1.0),))
    return result, runner


@pytest.mark.parametrize("rates", [(2.0, 6.0), (2.0, 4.5, 6.0), (2.0, 4.0, 6.0), (1.0, 2.0, 3.0, 5.0, 8.0)])
def test_a_monotone_curve_has_one_sustainable_rate_whatever_the_grid(rates: tuple[float, ...]) -> None:
    # p99 TTFT = 0.1 r^2 s meets 1 s up to r = sqrt(10) = 3.1623: to three digits 3.16 (0.9986 s) meets and
    # 3.17 (1.0049 s) fails. Main bisected 5 times from the grid's bracket: 3.125 from (2, 6) and (2, 4, 6),
    # 3.094 from (2, 4.5, 6).
    result, runner = _capacity(lambda rate: 0.1 * rate**2, rates)
    (capacity,) = result.capacities or []
    assert (capacity.status, capacity.rate, capacity.bracket) == ("found", 3.16, (3.16, 3.17))
    assert capacity.non_monotone == ()
    assert len(runner.rates) <= len(rates) + 12  # the grid, then at most 12 rounds of bisection


# The issue's example: SLO ttft-p99 = 1 s; p99 TTFT 1.30 s at 4.0 req/s but 0.94 s at 4.5. This curve has those
# points, crosses 1 s upward at 3.3 and at 5.0, and downward at 4.4167 (between 4.0 and 4.5).
ISSUE_CURVE = ((2.0, 3.3, 4.0, 4.5, 5.0, 6.0), (0.5, 1.0, 1.30, 0.94, 1.0, 1.5))


def test_a_non_monotone_curve_is_reported_with_its_rates() -> None:
    def latency(rate: float) -> float:
        return float(np.interp(rate, *ISSUE_CURVE))

    # Main answered 3.25, 4.97 and 3.25 for grids (2, 6), (2, 4.5, 6) and (2, 4, 6). The first failure caps the
    # answer: from (2, 6) the first midpoint (4.00) fails, so, as from (2, 4, 6), the answer is 3.3.
    for rates in [(2.0, 6.0), (2.0, 4.0, 6.0)]:
        (capacity,) = _capacity(latency, rates)[0].capacities or []
        assert (capacity.rate, capacity.non_monotone) == (3.3, ())
    # A grid that tests both 4.0 and 4.5 sees the curve go down: the answer is still 3.3, and the report names
    # the failing rate and the higher one that meets the SLO.
    result, _ = _capacity(latency, (2.0, 4.0, 4.5, 6.0))
    (capacity,) = result.capacities or []
    assert (capacity.rate, capacity.non_monotone) == (3.3, ((4.0, 4.5),))
    assert result.to_dict()["capacity"][0]["non_monotone"] == [{"fails_at": 4.0, "meets_at": 4.5}]
    console = Console(width=200, record=True)
    console.print(capacity_table(result))
    for line in capacity_notes(result):
        console.print(line)
    text = console.export_text()
    assert "3.3 *" in text and "fails the SLOs at 4 req/s but meets them at 4.5" in text
    # (2, 4.5, 6) never tests below 4.5: the curve looks monotone there, and the answer is where it crosses at 5.
    (capacity,) = _capacity(latency, (2.0, 4.5, 6.0))[0].capacities or []
    assert (capacity.rate, capacity.non_monotone) == (5.0, ())


def test_no_rate_meeting_the_slo_searches_below_the_grid() -> None:
    # 0.1 r^2 <= 1 up to 3.16: from a grid starting at 8 the search halves (4: fails; 2: meets), then bisects.
    (capacity,) = _capacity(lambda rate: 0.1 * rate**2, (8.0, 16.0))[0].capacities or []
    assert (capacity.status, capacity.rate, capacity.bracket) == ("found", 3.16, (3.16, 3.17))
    (capacity,) = _capacity(lambda rate: 2.0, (1.0, 2.0))[0].capacities or []
    assert (capacity.status, capacity.rate) == ("none", None)


def test_seeds_average_the_replays_of_each_seed() -> None:
    trace = load_trace(AZURE, limit=100)
    axes = Axes(rates=(3.0,), strategies=("paged",), kv_memory=("2GiB",))
    result = sweep(trace, axes, Settings(seed=5, seeds=3, engine={"max_model_len": 8192}), LocalRunner(1))
    (row,) = result.rows.values()
    config = prepare(trace, Settings(engine={"max_model_len": 8192}), axes.points()).configs[axes.points()[0].curve]
    # The reference: replay() directly on the trace re-timed by seeds 5, 6 and 7, averaged by hand.
    direct = [replay(trace.with_poisson_arrivals(3.0, seed), config, "paged") for seed in (5, 6, 7)]
    assert row["ttft_p99_s"] == pytest.approx(sum(m.p99_ttft_s for m in direct) / 3, abs=1e-6)
    assert row["num_preemptions"] == pytest.approx(sum(m.num_preemptions for m in direct) / 3, abs=1e-6)
    assert row["throughput_tokens_per_s"] == pytest.approx(sum(m.throughput_tokens_per_s for m in direct) / 3,
                                                           abs=1e-6)
    assert len({m.p99_ttft_s for m in direct}) == 3  # the seeds differ, so the mean is not any one of them


def test_settings_leave_the_engine_defaults_to_simconfig() -> None:
    trace = load_trace(AZURE, limit=20)
    points = Axes(rates=(1.0,), strategies=("paged",), kv_memory=("2GiB",)).points()
    config = prepare(trace, Settings(engine={"max_num_seqs": 8}), points).configs[points[0].curve]
    # The point's own fields (capacity, block size, prefix caching) and the one given; every other field as
    # SimConfig's constructor defaults it.
    reference = SimConfig.of(config.model, config.gpu, num_blocks=config.cache.num_blocks,
                             block_size=points[0].block_size,
                             prefix_caching=points[0].prefix_caching, max_num_seqs=8)
    assert config == reference
    settings = {f.name for kind in (SimConfig, *CONCERNS.values()) for f in fields(kind)} - set(CONCERNS)
    shared = {f.name for f in fields(Settings)} & settings
    assert shared == {"calibration"}  # a path here, the loaded table there: no engine field written twice


@pytest.mark.parametrize("scheduler", ["v1", "v0"])
def test_a_points_configuration_is_the_one_simconfig_builds_for_its_engine(scheduler: str) -> None:
    trace = load_trace(AZURE, limit=20)
    settings = Settings(engine={"scheduler": scheduler, "max_model_len": 8192})
    caching = settings.engine_prefix_caching()
    points = Axes(rates=(1.0,), strategies=("paged",), kv_memory=("2GiB",), prefix_caching=(caching,),
                  block_sizes=(16,)).points()
    config = prepare(trace, settings, points).configs[points[0].curve]
    # The reference: SimConfig built directly for that engine, everything it resolves (limits, prefix caching,
    # watermark) left to it; 2 GiB of Qwen3-8B's 144 KiB per token in blocks of 16.
    model, gpu = load_model("qwen3-8b"), load_gpu("h200")
    reference = SimConfig.of(model, gpu, num_blocks=2 * 2**30 // (16 * model.kv_bytes_per_token), block_size=16,
                             max_model_len=8192, scheduler=scheduler)
    assert config == reference
    # By hand, from vLLM: v1 is `vllm serve` on an H200 (8192 tokens a step, 1024 sequences, prefix caching, no
    # watermark); v0 the paper's engine (whole prompts, 256 sequences, no prefix caching, 1 % watermark).
    expected = {"v1": ("v1", 8192, 1024, True, 0.0), "v0": ("v0", None, 256, False, 0.01)}[scheduler]
    engine = config.engine
    assert (engine.scheduler, engine.max_batched_tokens, engine.max_num_seqs, config.cache.prefix_caching,
            engine.watermark) == expected


@pytest.mark.parametrize("scheduler", [None, "v1", "v0"])
def test_the_default_prefix_caching_follows_the_engine_as_in_simulate(tmp_path: Path, scheduler: str | None) -> None:
    engine = [] if scheduler is None else ["--scheduler", scheduler]
    out = tmp_path / "s.json"
    result = runner.invoke(app, ["sweep", AZURE, "--limit", "20", "--kv-memory", "2GiB", "--max-model-len", "8192",
                                 "--rates", "1", "--strategies", "paged", "--workers", "1", "--json", str(out),
                                 *engine])
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    simulated = runner.invoke(app, ["simulate", AZURE, "--limit", "20", "--kv-memory", "2GiB", "--max-model-len",
                                    "8192", "--strategies", "paged", "--json", "-", *engine])
    assert simulated.exit_code == 0, simulated.output
    # vLLM v1 (the default) caches prefixes unless told not to; v0 did not.
    on = scheduler != "v0"
    assert document["settings"]["scheduler"] == (scheduler or "v1")
    assert [point["prefix_caching"] for point in document["points"]] == [on]
    assert json.loads(simulated.stdout)["config"]["prefix_caching"] is on


def test_an_explicit_prefix_caching_axis_overrides_the_engines() -> None:
    result = runner.invoke(app, ["sweep", AZURE, "--limit", "20", "--kv-memory", "2GiB", "--max-model-len", "8192",
                                     "--rates", "1", "--strategies", "paged", "--workers", "1", "--json", "-",
                                     "--prefix-caching", "off,on", "--scheduler", "v0"])
    assert result.exit_code == 0, result.output
    assert [p["prefix_caching"] for p in json.loads(result.stdout)["points"]] == [False, True]


def test_the_defaults_shared_with_simulate_are_read_from_sim_config() -> None:
    # One sweep point by default holds the KV capacity simulate holds by default (0.9 of the GPU minus the
    # weights, blocks of 16), and verify and calibrate page in simulate's blocks.
    from minipaged_cli.apps.calibrate import CalibrationGrid
    from minipaged_cli.cli.sweep import sweep_command
    from minipaged_cli.cli.verify import verify_command

    assert Settings().gpu_memory_utilization == DEFAULT_GPU_MEMORY_UTILIZATION
    assert inspect.signature(sweep_command).parameters["gpu_memory_utilization"].default \
        == DEFAULT_GPU_MEMORY_UTILIZATION
    assert inspect.signature(sweep_command).parameters["block_sizes"].default == str(DEFAULT_BLOCK_SIZE)
    assert Axes(rates=(1.0,), strategies=("paged",)).block_sizes == (DEFAULT_BLOCK_SIZE,)
    assert inspect.signature(verify_command).parameters["block_size"].default == DEFAULT_BLOCK_SIZE
    assert {f.name: f.default for f in fields(CalibrationGrid)}["block_size"] == DEFAULT_BLOCK_SIZE


def test_the_slowest_strategies_are_queued_first() -> None:
    # Paged and dynamic extents do the most bookkeeping a replay; the reservations after them, lower rates first.
    jobs = [Replay(Point("m", "g", None, 16, False, strategy, rate), 0)
            for strategy in ("max-reserve", "dynamic", "oracle-reserve", "paged") for rate in (4.0, 1.0)]
    order = [(job.point.strategy, job.point.rate) for job in longest_first(jobs)]
    assert order == [("paged", 1.0), ("paged", 4.0), ("dynamic", 1.0), ("dynamic", 4.0), ("max-reserve", 1.0),
                     ("oracle-reserve", 1.0), ("max-reserve", 4.0), ("oracle-reserve", 4.0)]


def test_an_slo_no_rate_meets_is_reported_not_an_error(tmp_path: Path) -> None:
    out = tmp_path / "s.json"
    result = runner.invoke(app, ["sweep", AZURE, *SMALL, "--rates", "1,2", "--strategies", "paged",
                                 "--slo", "ttft=0.000001", "--search-steps", "2", "--workers", "1",
                                 "--json", str(out)])
    assert result.exit_code == 0, result.output
    capacity = json.loads(out.read_text())["capacity"]
    assert capacity[0]["status"] == "none" and capacity[0]["capacity_rps"] is None
    assert "none meets" in result.output


def test_json_csv_and_table_carry_the_same_points(tmp_path: Path) -> None:
    out, table = tmp_path / "s.json", tmp_path / "s.csv"
    result = runner.invoke(app, ["sweep", AZURE, *SMALL, "--rates", "0.5,2", "--strategies", "paged,oracle-reserve",
                                 "--json", str(out), "--csv", str(table), "--plot", str(tmp_path / "s.png"),
                                 "--workers", "1"])
    assert result.exit_code == 0, result.output
    points = json.loads(out.read_text())["points"]
    with open(table, newline="") as file:
        rows = list(csv.DictReader(file))
    assert len(points) == len(rows) == 4
    for point, row in zip(points, rows, strict=True):
        assert float(row["rate"]) == point["rate"] and row["strategy"] == point["strategy"]
        assert float(row["normalized_latency_mean_s"]) == pytest.approx(point["normalized_latency_mean_s"])
        assert f"{point['throughput_tokens_per_s']:,.0f}" in result.output
    assert (tmp_path / "s.png").stat().st_size > 10_000


def test_a_sweep_file_names_the_axes_and_the_command_line_wins(tmp_path: Path) -> None:
    config = tmp_path / "sweep.yaml"
    config.write_text("rates: [0.5, 1]\nstrategies: [paged]\nkv_memory: [4GiB]\nmax_model_len: 8192\nlimit: 100\n"
                      "slo: {normalized-latency: 10}\nsearch_steps: 1\n")
    out = tmp_path / "s.json"
    result = runner.invoke(app, ["sweep", AZURE, "--config", str(config), "--rates", "2", "--workers", "1",
                                 "--json", str(out)])
    assert result.exit_code == 0, result.output
    document = json.loads(out.read_text())
    assert {p["rate"] for p in document["points"]} == {2.0}  # the command line's --rates
    assert document["slo"] == ["normalized-latency <= 10 s"] and document["settings"]["max_model_len"] == 8192


@pytest.mark.parametrize(("args", "message"), [
    (["--rates", ""], "error: --rates: '': name at least one value"),
    (["--rates", "1,0"], "error: --rates: 0: must be > 0"),
    (["--rates", "1,-2"], "error: --rates: -2: must be > 0"),
    (["--rates", "1", "--strategies", "paged,buddy"], "error: --strategies: 'buddy': unknown strategy"),
    (["--rates", "1", "--block-sizes", ","], "error: --block-sizes: ',': name at least one value"),
    (["--rates", "1", "--slo", "latency=1"], "error: --slo: 'latency=1': expected NAME=SECONDS"),
    (["--rates", "1", "--prefix-caching", "maybe"], "error: --prefix-caching: 'maybe': expected"),
    (["--rates", "1", "--ray", "127.0.0.1:9"], "error: --ray: '127.0.0.1:9': cannot reach a Ray cluster there"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path: Path, args: list[str], message: str) -> None:
    out = tmp_path / "s.json"
    result = runner.invoke(app, ["sweep", AZURE, *SMALL, *args, "--json", str(out), "--csv", str(tmp_path / "s.csv")])
    assert result.exit_code == 2, result.output
    assert len(result.output.strip().splitlines()) == 1 and result.output.startswith(message)
    assert not out.exists() and not (tmp_path / "s.csv").exists()


RAY_ARGS = ["sweep", AZURE, *SMALL, "--rates", "1,4", "--strategies", "paged,max-reserve",
            "--slo", "normalized-latency=0.05", "--search-steps", "1"]
# A Ray cluster in a process of its own, as `ray start` would run it, until its stdin closes.
RAY_HEAD = ("import ray, sys; context = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, "
            "configure_logging=False); print(context.address_info['gcs_address'], flush=True); sys.stdin.read(); "
            "ray.shutdown()")


@pytest.fixture
def ray_env(tmp_path: Path) -> Any:
    """The environment of a shell with Ray 2.x installed and nothing set: no RAY_* variables (RAY_AUTH_MODE, which
    ray.init() sets in its own process, would hide what a user's fresh shell sees), and a Ray temp directory of
    its own, so that no cluster another process started on this machine is found (short: it holds sockets)."""
    pytest.importorskip("ray") if os.environ.get("MINIPAGED_REQUIRE_SHARED") is None else __import__("ray")
    ray_dir = tempfile.mkdtemp(prefix="ray", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    yield {**env, "RAY_TMPDIR": ray_dir}
    shutil.rmtree(ray_dir, ignore_errors=True)


def _sweep_process(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "minipaged_cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=ROOT, env=env)


@pytest.mark.slow
def test_the_same_answers_on_a_ray_cluster_named_by_its_address(tmp_path: Path, ray_env: dict[str, str]) -> None:
    local = runner.invoke(app, [*RAY_ARGS, "--workers", "2", "--json", str(tmp_path / "local.json")])
    assert local.exit_code == 0, local.output
    head = subprocess.Popen([sys.executable, "-c", RAY_HEAD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True, env=ray_env)
    try:
        address = head.stdout.readline().strip() if head.stdout else ""
        # Ray 2.60 starts new clusters with token authentication, and sends the token only to a cluster it finds
        # on its own: one named by its address refused the sweep ("Failed to connect") before it sent it too.
        remote = _sweep_process([*RAY_ARGS, "--ray", address, "--json", str(tmp_path / "ray.json")], ray_env)
    finally:
        head.communicate(timeout=120)
    assert remote.returncode == 0, remote.stdout + remote.stderr
    assert f"on Ray at {address}" in remote.stdout
    assert json.loads((tmp_path / "ray.json").read_text()) == json.loads((tmp_path / "local.json").read_text())


@pytest.mark.slow
def test_ray_with_no_cluster_running_starts_one_and_says_so(tmp_path: Path, ray_env: dict[str, str]) -> None:
    local = runner.invoke(app, [*RAY_ARGS, "--workers", "1", "--json", str(tmp_path / "local.json")])
    assert local.exit_code == 0, local.output
    started = _sweep_process([*RAY_ARGS, "--ray", "--json", str(tmp_path / "ray.json")], ray_env)
    assert started.returncode == 0, started.stdout + started.stderr
    assert "No Ray cluster was running: a local Ray cluster (" in started.stderr
    assert "started for this sweep" in started.stdout
    assert json.loads((tmp_path / "ray.json").read_text()) == json.loads((tmp_path / "local.json").read_text())


# -- the physical layout ---------------------------------------------------------------------------------------


def test_slot_owners_by_hand() -> None:
    from minipaged_cli.memory.allocators import Holding

    paged = PagedAllocator(num_blocks=6, block_size=4)
    a, b = Holding(7, 5, 3), Holding(9, 3, 1)
    paged.admit(a, 5)  # blocks 0, 1 (tokens 0-4)
    paged.admit(b, 3)  # block 2
    paged.release(a)
    c = Holding(11, 6, 1)
    paged.admit(c, 6)  # the freed blocks
    owners = paged.slot_owners(np.arange(24))
    blocks = {i: owners[4 * i] for i in range(6)}
    tables = {sid: s.block_table for sid, s in paged.manager.sequences.items()}
    assert all(blocks[block] == sid for sid, table in tables.items() for block in table)
    assert sorted(i for i, o in blocks.items() if o == -1) == sorted(set(range(6)) - {x for t in tables.values()
                                                                                      for x in t})
    oracle = OracleReserveAllocator(capacity_tokens=20, max_model_len=20)
    first, second = Holding(1, 4, 2), Holding(2, 3, 3)
    oracle.admit(first, 4)  # [0, 6)
    oracle.admit(second, 3)  # [6, 12)
    oracle.release(first)  # a hole at [0, 6)
    assert oracle.slot_owners(np.arange(0, 20, 2)).tolist() == [-1, -1, -1, 2, 2, 2, -1, -1, -1, -1]


def test_the_sweep_plot_labels_its_log_axis_with_numbers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    from minipaged_cli.cli import plot

    drawn: list[Any] = []
    monkeypatch.setattr(plot, "_save", lambda figure, path, plt, field="--plot": drawn.append(figure))
    trace = load_trace(AZURE, limit=100)
    axes = Axes(rates=(1.0, 50.0), strategies=("paged",), kv_memory=("2GiB",))
    plot.plot_sweep(sweep(trace, axes, Settings(engine={"max_model_len": 8192}), LocalRunner(1)),
                    tmp_path / "s.png", title="t")
    (figure,) = drawn
    figure.canvas.draw()
    (ax,) = figure.axes
    low, high = ax.get_ylim()
    ticks = [(tick.get_loc(), tick.label1.get_text()) for tick in [*ax.yaxis.get_major_ticks(),
                                                                  *ax.yaxis.get_minor_ticks()]
             if low <= tick.get_loc() <= high and tick.label1.get_text()]
    # Each label the number at its tick, as a plain decimal, not the raw TeX of a formula left unparsed
    # ('$\mathdefault{10^{-1}}$').
    assert ticks and all(float(text) == pytest.approx(loc) for loc, text in ticks), ticks


def test_plot_layout_draws_each_strategy(tmp_path: Path) -> None:
    png = tmp_path / "layout.png"
    result = runner.invoke(app, ["simulate", str(ROOT / "traces" / "holes.yaml"), "--plot-layout", str(png)])
    assert result.exit_code == 0, result.output
    assert png.stat().st_size > 10_000


def test_simulate_does_not_import_ray() -> None:
    code = ("import sys; from minipaged_cli.cli.main import app; from typer.testing import CliRunner; "
            f"r = CliRunner().invoke(app, ['simulate', {AZURE!r}, '--limit', '20', '--strategies', 'paged']); "
            "assert r.exit_code == 0, r.output; assert 'ray' not in sys.modules, 'simulate imported ray'")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
