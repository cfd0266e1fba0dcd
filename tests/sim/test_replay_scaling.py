"""A replay's cost in proportion to its trace: finished requests leave only their latencies behind, those
equal the figures the full records gave, and the benchmark that measures the growth runs."""

from __future__ import annotations

import os
import subprocess
import sys
import weakref
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from minipaged_cli.sim import accounting as accounting_module
from minipaged_cli.sim import scheduler as scheduler_module
from minipaged_cli.sim import scheduler_v0 as scheduler_v0_module
from minipaged_cli.sim.accounting import Accounting
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.live_request import LiveRequest
from minipaged_cli.sim.replay import Replay, replay
from minipaged_cli.workloads.presets import GpuSpec, ModelSpec
from minipaged_cli.workloads.trace import Request, Trace, make_trace

ROOT = Path(__file__).resolve().parents[2]
# (scheduler, strategy, prefix caching): v1 queues parallel samples at arrival, v0 forks them after the prefill
ENGINES = [("v1", "paged", True), ("v1", "dynamic", False), ("v0", "paged", False), ("v0", "oracle-reserve", False)]


def sampled_trace(seed: int, num_requests: int = 60) -> Trace:
    """Requests with 1 to 4 parallel samples, some of one output token, some longer than max_model_len 64."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(0.004, num_requests))
    return make_trace("sampled", [Request(f"r{i}", float(arrivals[i]), int(rng.integers(1, 40)),
                                          int(rng.integers(1, 40)), n=int(rng.integers(1, 5)))
                                  for i in range(num_requests)], source="test")


def engine_config(model: ModelSpec, gpu: GpuSpec, scheduler: str, prefix_caching: bool) -> SimConfig:
    """Little memory: preemptions, recomputed samples, and rejections of what can never fit."""
    return SimConfig.of(model, gpu, num_blocks=24, block_size=4, max_model_len=64, scheduler=scheduler,
                        prefix_caching=prefix_caching)


class TrackedLiveRequest(LiveRequest):
    """A LiveRequest that registers itself, weakly: the set holds the ones something still references."""

    alive: ClassVar[weakref.WeakSet[LiveRequest]] = weakref.WeakSet()

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        TrackedLiveRequest.alive.add(self)


@pytest.mark.parametrize(("scheduler", "strategy", "prefix_caching"), ENGINES)
def test_finished_requests_are_not_retained(monkeypatch: pytest.MonkeyPatch, tiny_model: ModelSpec,
                                            clock_gpu: GpuSpec, scheduler: str, strategy: str,
                                            prefix_caching: bool) -> None:
    # After every iteration the only sequences alive are the queued and running ones: a finished or rejected
    # sequence leaves its latencies in float arrays and nothing else (the accounting once kept every
    # finished sequence to the end: memory and collector time growing with the trace).
    monkeypatch.setattr(scheduler_module, "LiveRequest", TrackedLiveRequest)
    monkeypatch.setattr(scheduler_v0_module, "LiveRequest", TrackedLiveRequest)
    TrackedLiveRequest.alive = weakref.WeakSet()
    config = engine_config(tiny_model, clock_gpu, scheduler, prefix_caching)
    trace = sampled_trace(35)
    engine = Replay(trace, config, config.allocator(strategy), bulk=True, progress=None)
    strays = []

    def check(num_done: int) -> None:
        queued = {id(live) for live in (*engine.scheduler.running, *engine.scheduler.waiting)}
        strays.extend(live for live in TrackedLiveRequest.alive if id(live) not in queued)

    engine.progress = check
    metrics = engine.run()
    assert metrics.completed_requests > 0 and metrics.rejected_requests > 0
    assert metrics.num_preemptions > 0 or strategy == "oracle-reserve"  # (an exact reservation never preempts)
    assert strays == []
    assert len(TrackedLiveRequest.alive) == 0  # (the replay object still referenced)
    latencies = engine.accounting.latencies
    # Only requests with samples running are counted, and those v0 rejected before it forked their samples
    assert set(engine.accounting.samples_left) <= engine.accounting.rejected and latencies.pending == {}
    # 8 bytes a figure: a TTFT per request served, an end-to-end and a normalized latency per completed request
    assert len(latencies.e2e_s) == len(latencies.normalized_s) >= metrics.completed_requests


def reference_latencies(finished: list[tuple[LiveRequest, float]], rejected: set[int],
                        first_arrival_s: float) -> dict[str, float | None]:
    """The naive reference: every finished sequence kept with its finish time, the figures computed at the end
    (what ``Accounting.metrics`` did before it counted as it went)."""
    firsts = [r.first_token_s - r.request.arrival_s for r, _ in finished if r.sample == 0]
    tpots = [(t - r.first_token_s) / (r.output_tokens - 1) for r, t in finished if r.output_tokens > 1]
    last: dict[int, tuple[LiveRequest, float]] = {}
    for live, finish in finished:
        if live.request_index not in rejected and finish >= last.get(live.request_index, (live, -1.0))[1]:
            last[live.request_index] = (live, finish)
    e2e = [finish - live.request.arrival_s for live, finish in last.values()]
    normalized = [(finish - live.request.arrival_s) / live.output_tokens for live, finish in last.values()]
    makespan = max(t for _, t in finished) - first_arrival_s
    return {
        "mean_ttft_s": float(np.mean(firsts)) if firsts else None,
        "p99_ttft_s": float(np.percentile(firsts, 99)) if firsts else None,
        "mean_tpot_s": float(np.mean(tpots)) if tpots else None,
        "mean_e2e_s": float(np.mean(e2e)) if e2e else None,
        "p99_e2e_s": float(np.percentile(e2e, 99)) if e2e else None,
        "mean_normalized_latency_s": float(np.mean(normalized)) if normalized else None,
        "p99_normalized_latency_s": float(np.percentile(normalized, 99)) if normalized else None,
        "makespan_s": makespan,
        "throughput_tokens_per_s": sum(r.output_tokens for r, _ in finished) / makespan,
    }


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize(("scheduler", "strategy", "prefix_caching"), ENGINES)
def test_latencies_equal_the_figures_of_the_full_records(monkeypatch: pytest.MonkeyPatch, tiny_model: ModelSpec,
                                                         clock_gpu: GpuSpec, seed: int, scheduler: str,
                                                         strategy: str, prefix_caching: bool) -> None:
    # Exactly, not approximately: the values are the same floats in the same order, so the means (numpy's
    # pairwise sums) and the percentiles are the same to the last bit.
    finished: list[tuple[LiveRequest, float]] = []
    sample_done = Accounting.sample_done

    def recorded(self: Accounting, live: LiveRequest, now: float) -> None:
        finished.append((live, now))
        sample_done(self, live, now)

    monkeypatch.setattr(accounting_module.Accounting, "sample_done", recorded)
    trace = sampled_trace(seed)
    rejected: set[int] = set()
    rejected_sample = Accounting.rejected_sample

    def noted(self: Accounting, live: LiveRequest, reason: str) -> None:
        rejected.add(live.request_index)
        rejected_sample(self, live, reason)

    monkeypatch.setattr(accounting_module.Accounting, "rejected_sample", noted)
    metrics = replay(trace, engine_config(tiny_model, clock_gpu, scheduler, prefix_caching), strategy)
    assert any(r.request.n > 1 for r, _ in finished) and rejected
    expected = reference_latencies(finished, rejected, trace.requests[0].arrival_s)
    assert {name: getattr(metrics, name) for name in expected} == expected


def live(request: Request, index: int, sample: int, first_token_s: float) -> LiveRequest:
    """A sequence of ``request`` whose other samples exist (as under v1: ``forked``)."""
    return LiveRequest(index, request.prompt_tokens, request.output_tokens, request=request, request_index=index,
                       sample=sample, first_token_s=first_token_s, forked=True)


def test_a_request_keeps_its_place_and_its_last_samples_latency() -> None:
    # Request 0 (two samples) finishes its first sample before request 1 finishes and its second after: its
    # end-to-end latency is its second sample's and comes first, where its first sample finished (the order the
    # means are summed in). Request 2 is rejected after one sample finished: it never completed, so it leaves.
    # Request 3's first sample is rejected before its second finishes: no latency either.
    requests = [Request("a", 0.0, 5, 4, n=2), Request("b", 1.0, 5, 2), Request("c", 2.0, 5, 3, n=2),
                Request("d", 3.0, 5, 1, n=2)]
    accounting = Accounting(capacity_tokens=100, kv_bytes_per_token=1, record_timeline=False)
    for index, request in enumerate(requests):
        accounting.arrived(index, request.n)
    accounting.sample_done(live(requests[0], 0, 0, 0.5), 4.0)
    accounting.sample_done(live(requests[2], 2, 0, 2.75), 5.0)
    accounting.sample_done(live(requests[1], 1, 0, 1.25), 6.0)
    accounting.rejected_sample(live(requests[2], 2, 1, 2.75), "no room")
    accounting.rejected_sample(live(requests[3], 3, 0, 3.5), "no room")
    accounting.sample_done(live(requests[0], 0, 1, 0.5), 8.0)
    accounting.sample_done(live(requests[3], 3, 1, 3.5), 9.0)
    assert accounting.num_completed == 2
    e2e, normalized = accounting.latencies.request_latencies()
    assert e2e.tolist() == [8.0, 5.0] and normalized.tolist() == [2.0, 2.5]
    assert accounting.latencies.ttft_s.tolist() == [0.5, 0.75, 0.25]  # sample 0 of a, c, b (d's was rejected)
    assert accounting.latencies.pending == {} and accounting.samples_left == {}


def test_replay_scaling_bench_prints_the_ratio_to_the_first_size(tmp_path: Path) -> None:
    # Both sides are this checkout: the harness, not the speed, is under test here.
    rows = [f"2023-11-16 18:15:{second:02d}.0000000,{100 + 7 * second},{5 + second % 9}" for second in range(40)]
    (tmp_path / "AzureLLMInferenceTrace_conv.csv").write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n"
                                                              + "\n".join(rows) + "\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    markdown = tmp_path / "scaling.md"
    result = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "replay_scaling.py"), "--traces", str(tmp_path),
                             "--copies", "1,3", "--repeats", "1", "--baseline-path", str(ROOT), "--markdown",
                             str(markdown)], env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith(("this", "baseline"))]
    assert [(row[0], row[2], row[3]) for row in rows] == [("baseline", "x1", "40"), ("baseline", "x3", "120"),
                                                          ("this", "x1", "40"), ("this", "x3", "120")]
    assert rows[1][6:8] in (["within", "3.15x"], ["NOT", "within"])
    assert rows[2][-1].endswith("x") and rows[3][-1].endswith("x")  # this / baseline
    table = markdown.read_text()
    assert "python benchmarks/replay_scaling.py --copies 1,3 --repeats 1" in table and table.count("| x3 |") == 2
