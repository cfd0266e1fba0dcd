"""The fleet against independent references: ``simulate`` run alone (one replica; each round-robin slice), a
hand-built prefix trace routed by hand, a hand count of what a too-small approximate index forgets, and a property:
nothing is lost."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from minipaged_cli.fleet.config import FleetConfig, KvLink, ReplicaPool, RouterConfig
from minipaged_cli.fleet.fleet import run_fleet
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import simulate
from minipaged_cli.workloads.presets import load_gpu, load_model
from minipaged_cli.workloads.readers import load_trace
from minipaged_cli.workloads.trace import Request, Trace

TRACES = sorted(Path(__file__).parents[2].joinpath("traces").glob("*.yaml"))


def config(num_blocks: int = 4000, **kwargs: object) -> SimConfig:
    """Qwen3-8B on an H200 in blocks of 16 tokens (the hand counts below are in them)."""
    kwargs.setdefault("block_size", 16)
    return SimConfig.of(model=load_model("qwen3-8b"), gpu=load_gpu("h200"), num_blocks=num_blocks, **kwargs)


def fleet(num_replicas: int, sim: SimConfig, router: str = "round-robin", **kwargs: object) -> FleetConfig:
    return FleetConfig((ReplicaPool("replicas", num_replicas, sim),), RouterConfig(router), **kwargs)


@pytest.mark.parametrize("path", TRACES, ids=lambda p: p.stem)
@pytest.mark.parametrize("num_blocks", [4000, 300])
def test_one_replica_is_simulate(path: Path, num_blocks: int) -> None:
    """Every field of simulate's paged metrics, to the last digit (300 blocks: preemptions and rejections)."""
    trace, sim = load_trace(path, "auto"), config(num_blocks)
    expected = simulate(trace, sim, ("paged",)).strategies["paged"].to_dict()
    document = run_fleet(trace, fleet(1, sim, "prefix-aware")).to_dict()
    assert document.get("sessions") == expected.pop("sessions", None)  # (the clients: the fleet's, not a replica's)
    replica = document["replicas"][0]
    assert {key: replica[key] for key in expected} == expected


@pytest.mark.parametrize("model", ["gemma-3-27b", "deepseek-v3"])
def test_one_replica_is_simulate_hybrid_and_latent(model: str) -> None:
    """Sliding windows (the hybrid manager's groups, KV events named (group, key)) and latent attention."""
    trace = load_trace(Path("traces/mixed.yaml"), "auto")
    sim = SimConfig.of(model=load_model(model), gpu=load_gpu("h200"), num_blocks=3000)
    expected = simulate(trace, sim, ("paged",)).strategies["paged"].to_dict()
    replica = run_fleet(trace, fleet(1, sim, "prefix-aware")).to_dict()["replicas"][0]
    assert {key: replica[key] for key in expected} == expected


def test_one_replica_with_tiers_is_simulate() -> None:
    trace, sim = load_trace(TRACES[-1], "auto"), config(600, cpu_kv_blocks=2000)
    expected = simulate(trace, sim, ("paged",)).strategies["paged"].to_dict()
    replica = run_fleet(trace, fleet(1, sim)).to_dict()["replicas"][0]
    assert {key: replica[key] for key in expected} == expected


@pytest.mark.parametrize("num_replicas", [2, 3])
def test_round_robin_is_independent_slices(num_replicas: int) -> None:
    """No shared prefixes: replica i replays requests i, i + N, ... exactly as simulate replays that slice alone."""
    trace, sim = load_trace(Path("traces/azure_conv_1k.yaml"), "auto"), config(600)
    replicas = run_fleet(trace, fleet(num_replicas, sim)).to_dict()["replicas"]
    for index, replica in enumerate(replicas):
        alone = Trace(f"slice-{index}", trace.requests[index::num_replicas], trace.segments)
        expected = simulate(alone, sim, ("paged",)).strategies["paged"].to_dict()
        assert replica["num_requests"] == alone.num_requests
        assert {key: replica[key] for key in expected} == expected


def prefix_trace(num_prefixes: int, rounds: int) -> Trace:
    """Prefix k of 4 blocks (64 tokens) plus 8 tokens of its own: the request's full blocks are the prefix's.
    The first round sends p0..p(K-1) 1 ms apart (they spread over the replicas); the later rounds send them in
    the same order 5 s apart, each alone in an idle fleet."""
    requests = [Request(f"r0-p{k}", 0.001 * k, 72, 20, prefix=(f"p{k}",)) for k in range(num_prefixes)]
    requests += [Request(f"r{1 + i // num_prefixes}-p{i % num_prefixes}", 10.0 + 5.0 * i, 72, 20,
                         prefix=(f"p{i % num_prefixes}",)) for i in range((rounds - 1) * num_prefixes)]
    return Trace("prefixes", tuple(requests), {f"p{k}": 64 for k in range(num_prefixes)})


def test_prefix_aware_sends_every_repeat_to_its_holder() -> None:
    trace = prefix_trace(4, 3)
    result = run_fleet(trace, FleetConfig((ReplicaPool("r", 3, config()),), RouterConfig("prefix-aware"),
                                          log_decisions=True))
    chosen = [d.replica for d in result.decisions]
    holders = chosen[:4]
    assert len(set(holders)) == 3  # the first round spreads (least loaded)
    assert chosen[4:] == holders * 2
    # every repeat found its 4 prefix blocks on its replica: 8 repeats x 64 tokens of 12 x 72 looked up
    document = result.to_dict()
    assert (document["prefix_cache_hits"], document["prefix_cache_queries"]) == (8 * 64, 12 * 72)


@pytest.mark.parametrize("capacity", [16, 12])
def test_approximate_index_too_small_forgets(capacity: int) -> None:
    """4 prefixes of 4 blocks sent in turn. An index of 16 entries remembers every one: 8 repeats x 4 blocks
    matched, every repeat to its holder, the precise router's 8 x 64 hit tokens. One of 12 entries (3 prefixes):
    LRU forgets each prefix just before it recurs (the cyclic pattern), nothing is ever matched, and the idle
    fleet's tie-break sends every later request to replica 0. Hand count of its hits: in round 2, the prefixes
    the first round left on replica 0; in round 3, all 4 (round 2 put them there)."""
    trace = prefix_trace(4, 3)
    router = RouterConfig("prefix-aware", prefix_index="approximate", index_capacity=capacity)
    result = run_fleet(trace, FleetConfig((ReplicaPool("r", 3, config()),), router, log_decisions=True))
    chosen = [d.replica for d in result.decisions]
    holders = chosen[:4]
    hits = result.to_dict()["prefix_cache_hits"]
    # 12 requests send 4 entries each; 16 entries hold them all (repeats refresh), 12 forget all but the last 12
    assert result.to_dict()["router"]["index_forgotten"] == (0 if capacity == 16 else 48 - 12)
    if capacity == 16:
        assert sum(max(d.scores) for d in result.decisions) == 8 * 4
        assert chosen[4:] == holders * 2
        assert hits == 8 * 64
    else:
        assert sum(max(d.scores) for d in result.decisions) == 0
        assert chosen[4:] == [0] * 8
        assert hits == 64 * (holders.count(0) + 4) < 8 * 64


requests_strategy = st.lists(st.tuples(st.floats(0, 2), st.integers(1, 300), st.integers(1, 40),
                                       st.sampled_from([(), ("a",), ("b",)])), min_size=1, max_size=10)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests_strategy, st.integers(1, 3), st.sampled_from(["round-robin", "least-loaded", "prefix-aware",
                                                             "weighted"]),
       st.integers(12, 60), st.sampled_from(["alone", "disaggregated", "tiers", "shared store"]))
def test_nothing_lost(rows: list, num_replicas: int, router: str, num_blocks: int, layout: str) -> None:
    """Every request finishes exactly once somewhere in the fleet, or is rejected once: co-located replicas alone,
    with host tiers each, with one shared store, or P/D."""
    rows.sort(key=lambda row: row[0])
    trace = Trace("random", tuple(Request(f"q{i}", t, p, o, prefix=x) for i, (t, p, o, x) in enumerate(rows)),
                  {"a": 32, "b": 48})
    trace = Trace(trace.name, tuple(r for r in trace.requests if r.prompt_tokens > sum(trace.segments[s] for s in
                                                                                      r.prefix)), trace.segments)
    if not trace.requests:
        return
    sim = config(num_blocks, max_model_len=400, cpu_kv_blocks=8 if "tiers" in layout or "store" in layout else 0)
    if layout == "disaggregated":
        decode = config(max(num_blocks, 26), max_model_len=400)
        spec = FleetConfig((ReplicaPool("p", num_replicas, sim, role="prefill"),
                            ReplicaPool("d", 1, decode, role="decode")), RouterConfig(router),
                           kv_link=KvLink(50e9, 20e-6), prefill_threshold=64)
    else:
        spec = fleet(num_replicas, sim, router, shared_kv_store=layout == "shared store")
    try:
        result = run_fleet(trace, spec)
    except Exception as error:  # a trace no replica can hold at all is bad input, refused before the replay
        assert "too small for any request" in str(error) or "longer" in str(error)
        return
    document = result.to_dict()
    rejected = sum(replica["rejected_requests"] for replica in document["replicas"])
    done = [record.num_finished for record in result.records]
    assert all(count in (0, 1) for count in done)  # (n = 1: one sequence a request)
    assert sum(done) + rejected == trace.num_requests
    assert document["completed_requests"] == sum(done)


def test_one_request_through_1p1d_ttft_by_hand() -> None:
    """TTFT = prefill time + KV bytes / bandwidth + latency + the first decode step (the last prompt token
    recomputed on the decode replica, vLLM's rule). Qwen3-8B: 36 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes
    = 147,456 B/token in bf16; 1000 tokens over 50 GB/s = 2.94912 ms, plus 20 us."""
    from minipaged_cli.sim.step_time import StepTimeModel

    sim = config()
    assert sim.model.kv_bytes_per_token == 147_456
    step = StepTimeModel(sim.model, sim.gpu, None)
    prefill = float(step.step_seconds(new_tokens=1000, sequences=1, prefill_tokens=1000,
                                      prefill_attended=1000 * 1001 / 2, prefill_context=1000, decodes=0,
                                      decode_context=0, copied_tokens=0))
    first_decode = float(step.step_seconds(new_tokens=1, sequences=1, prefill_tokens=1, prefill_attended=1000,
                                           prefill_context=1000, decodes=0, decode_context=0, copied_tokens=0))
    transfer = 1000 * 147_456 / 50e9 + 20e-6
    trace = Trace("one", (Request("a", 0.0, 1000, 10),))
    spec = FleetConfig((ReplicaPool("p", 1, sim, role="prefill"), ReplicaPool("d", 1, sim, role="decode")),
                       kv_link=KvLink(50e9, 20e-6))
    document = run_fleet(trace, spec).to_dict()
    assert document["mean_ttft_s"] == pytest.approx(prefill + transfer + first_decode, abs=1e-6)
    assert document["mean_transfer_s"] == pytest.approx(transfer, abs=1e-6)
    assert document["kv_link"]["bytes"] == 147_456_000


def test_kv_link_queues_transfers() -> None:
    """Two prompts finishing their prefill in the same step: the second transfer waits for the first."""
    sim = config()
    trace = Trace("two", (Request("a", 0.0, 1000, 10), Request("b", 0.0, 1000, 10)))
    spec = FleetConfig((ReplicaPool("p", 1, sim, role="prefill"), ReplicaPool("d", 1, sim, role="decode")),
                       kv_link=KvLink(50e9, 20e-6))
    link = run_fleet(trace, spec).to_dict()["kv_link"]
    assert link["transfers"] == 2
    assert link["queued_s"] == pytest.approx(1000 * 147_456 / 50e9, abs=1e-6)


def test_short_prompts_stay_on_the_decode_replica() -> None:
    sim = config()
    trace = Trace("two", (Request("short", 0.0, 100, 10), Request("long", 0.0, 1000, 10)))
    spec = FleetConfig((ReplicaPool("p", 1, sim, role="prefill"), ReplicaPool("d", 1, sim, role="decode")),
                       kv_link=KvLink(50e9, 20e-6), prefill_threshold=256)
    result = run_fleet(trace, spec)
    assert [len(r.requests) for r in result.replicas] == [1, 2]
    assert result.to_dict()["kv_link"]["transfers"] == 1


def test_shared_store_serves_another_replicas_blocks() -> None:
    """Round-robin sends a prefix's two requests to two replicas: with per-replica tiers the second misses; with
    one shared store it loads what the first stored."""
    trace = Trace("shared", (Request("a", 0.0, 1040, 4, prefix=("s",)), Request("b", 5.0, 1040, 4, prefix=("s",))),
                  {"s": 1024})
    sim = config(cpu_kv_blocks=1000)
    alone = run_fleet(trace, fleet(2, sim)).to_dict()
    shared = run_fleet(trace, fleet(2, sim, shared_kv_store=True)).to_dict()
    assert alone["tiers"]["cpu"]["hit_tokens"] == 0
    assert shared["tiers"]["cpu"]["hit_tokens"] == 1024


@pytest.mark.parametrize(("prefix_index", "second"), [("precise", 1), ("approximate", 0)])
def test_router_sees_a_replica_as_of_its_last_completed_step(prefix_index: str, second: int) -> None:
    """Two requests sharing a prefix, 1 us apart: the first's step has not ended when the second arrives, so its
    blocks are not yet published (precise: no match; the first replica counts one request sent since, the second
    is less loaded) while the router's own index knows where it sent them (approximate: the first replica)."""
    trace = Trace("two", (Request("a", 0.0, 1040, 4, prefix=("s",)), Request("b", 1e-6, 1040, 4, prefix=("s",))),
                  {"s": 1024})
    router = RouterConfig("prefix-aware", prefix_index=prefix_index)
    result = run_fleet(trace, FleetConfig((ReplicaPool("r", 2, config()),), router, log_decisions=True))
    assert [d.replica for d in result.decisions] == [0, second]


def test_transfer_bytes_follow_the_kv_layout() -> None:
    """Qwen3-8B: every layer full attention, 147,456 B/token; fp8 halves it; a sliding-window model moves only the
    window's tokens in its sliding layers; latent attention its latent."""
    from minipaged_cli.fleet.disaggregation import transfer_bytes
    from minipaged_cli.workloads.presets import with_kv_cache_dtype

    assert transfer_bytes(config(), 1000) == 147_456_000
    fp8 = SimConfig.of(model=with_kv_cache_dtype(load_model("qwen3-8b"), "fp8_e4m3"), gpu=load_gpu("h200"),
                       num_blocks=4000)
    assert transfer_bytes(fp8, 1000) == 73_728_000
    gemma = SimConfig.of(model=load_model("gemma-3-27b"), gpu=load_gpu("h200"), num_blocks=4000)
    assert transfer_bytes(gemma, 100_000) < 100_000 * gemma.model.kv_bytes_per_token
    assert transfer_bytes(gemma, 100) == 100 * gemma.model.kv_bytes_per_token  # (inside every window)
    latent = SimConfig.of(model=load_model("deepseek-v3"), gpu=load_gpu("h200"), num_blocks=4000)
    assert transfer_bytes(latent, 1000) == 1000 * latent.model.kv_bytes_per_token
