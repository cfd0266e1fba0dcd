"""vLLM v0's swap preemption through the host tier (sim/tiers.py, sim/scheduler_v0.py): the swap space is the
host tier's capacity and every swap crosses its link, on the same clock as the tier's stores and loads, before the
step's forward. Hand-worked traces, invariants under random ones."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipaged_cli.memory.prefix import block_content_keys
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import Replay, simulate
from minipaged_cli.sim.scheduler import StepDecision
from minipaged_cli.sim.step_time import StepTimeModel
from minipaged_cli.workloads.trace import Request, make_trace
from tests.sim.test_tiers import BLOCK, BLOCK_BYTES, H200, HOST_LINK, QWEN3_8B, prefill_seconds, random_trace

ONE_BLOCK_S = BLOCK_BYTES / HOST_LINK  # 2,359,296 B over 49.92 GB/s = 47.26 us


class RecordedReplay(Replay):
    """A replay that keeps each single step's decision and duration."""

    def __init__(self, config: SimConfig, trace) -> None:
        super().__init__(trace, config, config.allocator("paged"), False, None)
        self.steps: list[tuple[float, StepDecision, float]] = []

    def _duration(self, decision: StepDecision) -> float:
        duration = super()._duration(decision)
        self.steps.append((self.now, decision, duration))
        return duration


def swap_trace():
    """A: a 32-token prompt (two full blocks), 10 output tokens; B: an 8-token prompt (a partial block), 5 output
    tokens; both at 0."""
    return make_trace("swap", [Request("a", 0.0, 32, 10), Request("b", 0.0, 8, 5)], source="test")


def v0_config(**fields: object) -> SimConfig:
    return SimConfig.of(QWEN3_8B, H200, num_blocks=3, block_size=BLOCK, scheduler="v0", prefix_caching=True,
                        preemption="swap", watermark=0.0, **fields)


def test_a_swap_queues_behind_a_store_on_the_host_link() -> None:
    # On a GPU pool of 3 blocks, step 1 prefills A (2 blocks) and B (1): the pool is full. Write-through stores A's
    # 2 full blocks after step 1, at its end t1: the write link is busy until t1 + 2 x 47.26 us. In step 2 A's 33rd
    # token needs a third block: B (admitted last) is swapped out, 1 block = 16 slots = 2,359,296 B; its copy
    # queues behind the store, so step 2's forward starts at t1 + 3 x 47.26 us = t1 + 141.8 us. The host tier
    # holds 2 blocks: B's swapped block takes one, evicting A's least recently stored block (its first). B swaps
    # back in (1 block over the read link, idle: 47.26 us) once A has finished and freed its blocks.
    run = RecordedReplay(v0_config(cpu_kv_blocks=2), swap_trace())
    metrics = run.run()
    model = StepTimeModel(QWEN3_8B, H200)
    (t0, first, d1), (t1, second, d2) = run.steps[:2]
    assert (t0, first.transfer_s, d1) == (0.0, 0.0, pytest.approx(float(model.step_seconds(
        new_tokens=40, sequences=2, prefill_tokens=40, prefill_attended=32 * 33 / 2 + 8 * 9 / 2,
        prefill_context=40))))
    assert t1 == d1 and [r.sequence_id for r in second.decoders] == [0] and second.swapped_tokens == 16
    assert pytest.approx(141.8e-6, rel=1e-3) == 3 * ONE_BLOCK_S
    assert second.transfer_s == pytest.approx(3 * ONE_BLOCK_S)
    decode = float(model.step_seconds(new_tokens=1, sequences=1, decodes=1, decode_context=33))
    assert d2 == pytest.approx(decode + 3 * ONE_BLOCK_S)
    swap_ins = [(decision, duration) for _, decision, duration in run.steps[2:] if decision.swapped_tokens]
    assert len(swap_ins) == 1 and swap_ins[0][0].transfer_s == pytest.approx(ONE_BLOCK_S)

    assert (metrics.num_swaps, metrics.swap_out_bytes, metrics.swap_in_bytes) == (1, BLOCK_BYTES, BLOCK_BYTES)
    cpu = metrics.tiers["cpu"]
    assert (cpu.stored_bytes, cpu.evictions, cpu.dropped_stores) == (2 * BLOCK_BYTES, 1, 0)
    host = run.tiers.tiers[0]
    assert host.write.busy_s == pytest.approx(3 * ONE_BLOCK_S)  # the store and the swap-out share it
    assert host.read.busy_s == pytest.approx(ONE_BLOCK_S)
    a_blocks = block_content_keys([(("prompt", 0), 32), (("output", 0, 0), 10)], BLOCK)
    assert host.store.hashes() == [a_blocks[1]] and host.store.num_reserved == 0
    assert not run.tiers.violations()


def test_without_the_host_tier_the_swap_pays_only_its_own_bytes() -> None:
    # The same engine with --cpu-blocks 2 and no host tier: nothing is stored, and the swap is timed by the old
    # model, its bytes at the preset's host bandwidth (64 GB/s), with no clock to queue behind.
    run = RecordedReplay(v0_config(cpu_blocks=2), swap_trace())
    metrics = run.run()
    _, _, d2 = run.steps[1]
    model = StepTimeModel(QWEN3_8B, H200)
    decode = float(model.step_seconds(new_tokens=1, sequences=1, decodes=1, decode_context=33))
    assert d2 == pytest.approx(decode + BLOCK_BYTES / 64e9)
    assert metrics.num_swaps == 1 and metrics.tiers == {}


def test_simulate_compares_with_the_same_swap_space_without_the_tier() -> None:
    result = simulate(swap_trace(), v0_config(cpu_kv_blocks=2), ("paged", "oracle-reserve"))
    assert result.config.swap_blocks == 2
    # (the contiguous strategy swaps through the host tier's link too, with nothing cached)
    assert set(result.without_tiers) == {"paged", "oracle-reserve"}
    assert result.to_dict()["config"]["cpu_kv_blocks"] == 2
    assert result.strategies["paged"].makespan_s > result.without_tiers["paged"].makespan_s


def test_a_v0_prompt_loads_from_the_host_tier_before_the_forward() -> None:
    # A (64-token system prompt + 1), B (another 64 + 1), C (A's prompt again), 10 s apart, one output token each,
    # on a v0 pool of 5 blocks: B's allocation evicts A's 4 cached blocks from the GPU, the host tier (8 blocks)
    # still has them. C's admitting step loads them (4 x 47.26 us) before its forward, then computes its last
    # token: its TTFT is the load plus a one-token prefill after 64 cached tokens, as v1's connector gives.
    requests = [Request("a", 0.0, 65, 1, prefix=("sys",)), Request("b", 10.0, 65, 1, prefix=("other",)),
                Request("c", 20.0, 65, 1, prefix=("sys",))]
    trace = make_trace("three", requests, source="test", segments={"sys": 64, "other": 64})
    cfg = SimConfig.of(QWEN3_8B, H200, num_blocks=5, block_size=BLOCK, scheduler="v0", prefix_caching=True,
                       cpu_kv_blocks=8)
    run = RecordedReplay(cfg, trace)
    metrics = run.run()
    model = StepTimeModel(QWEN3_8B, H200)
    whole, rest = prefill_seconds(model, 65, 0), prefill_seconds(model, 1, 64)
    cpu = metrics.tiers["cpu"]
    assert (cpu.hit_tokens, cpu.loaded_bytes, cpu.stored_bytes) == (64, 4 * BLOCK_BYTES, 8 * BLOCK_BYTES)
    assert run.steps[2][1].transfer_s == pytest.approx(4 * ONE_BLOCK_S)
    assert metrics.mean_ttft_s == pytest.approx((2 * whole + 4 * ONE_BLOCK_S + rest) / 3)


@settings(max_examples=15, deadline=None)
@given(st.integers(0, 10_000), st.integers(8, 16), st.integers(4, 40), st.booleans(),
       st.sampled_from(["write-through", "on-eviction"]), st.sampled_from(["lru", "arc"]))
def test_v0_replays_keep_the_tiers_invariants(seed: int, num_blocks: int, cpu: int, prefix_caching: bool,
                                              policy: str, eviction: str) -> None:
    # Whatever swaps, stores and loads interleave: the host tier never holds more than its capacity, cached and
    # swapped together; the swapped slots are all given back; every byte written is a store or a swap-out.
    trace = random_trace(seed, 25, 0.002)
    cfg = SimConfig.of(QWEN3_8B, H200, num_blocks=num_blocks, block_size=BLOCK, scheduler="v0",
                       prefix_caching=prefix_caching, preemption="swap", cpu_kv_blocks=cpu, offload_policy=policy,
                       tier_eviction=eviction, check_invariants=True, max_model_len=512)
    run = Replay(trace, cfg, cfg.allocator("paged"), True, None)
    metrics = run.run()
    assert metrics.invariant_violations == 0 and not run.tiers.violations()
    assert metrics.completed_requests + metrics.rejected_requests == trace.num_requests
    host = run.tiers.tiers[0]
    assert host.store.num_reserved == 0
    assert host.swap_out_bytes == metrics.swap_out_bytes
    assert host.write.num_bytes == metrics.tiers["cpu"].stored_bytes + metrics.swap_out_bytes


def test_simulate_prints_the_host_tier_as_the_swap_space(tmp_path) -> None:
    from typer.testing import CliRunner

    from minipaged_cli.cli.main import app

    trace = tmp_path / "swap.yaml"
    trace.write_text("version: 1\nname: swap\nrequests:\n"
                     "  - {id: a, arrival_s: 0.0, prompt_tokens: 32, output_tokens: 10}\n"
                     "  - {id: b, arrival_s: 0.0, prompt_tokens: 8, output_tokens: 5}\n")
    result = CliRunner().invoke(app, ["simulate", str(trace), "--strategies", "paged", "--scheduler", "v0",
                                      "--preemption", "swap", "--prefix-caching", "--num-blocks", "3",
                                      "--watermark", "0", "--cpu-kv-memory", str(2 * BLOCK_BYTES), "--json", "-"])
    assert result.exit_code == 0, result.output
    assert "also the swap space" in result.output
    assert '"swap_out_bytes": 2359296' in result.output and '"cpu_kv_blocks": 2' in result.output
