"""vLLM v1's scheduling, step by step on small traces worked by hand from vLLM's ``Scheduler.schedule`` and
``KVCacheManager.allocate_slots`` (vllm/v1/core/sched/scheduler.py, vllm/v1/core/kv_cache_manager.py, 0.33.0):
one token budget a step, running requests first in their order, then waiting ones first come first served from
what is left; the whole prompt must fit to be admitted, blocks are allocated (and cached) chunk by chunk, and the
last running request is preempted when a chunk's blocks are not there."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from minipaged_cli.cli.main import app
from minipaged_cli.errors import InputError
from minipaged_cli.memory.allocators import Allocator
from minipaged_cli.sim.config import SimConfig, vllm_serve_batch_defaults
from minipaged_cli.sim.replay import StepWork, replay
from minipaged_cli.workloads.presets import GpuSpec, ModelSpec, load_gpu
from minipaged_cli.workloads.trace import Request, make_trace
from tests.conftest import ROOT


def scheduled_tokens(trace, config: SimConfig) -> tuple[list[dict[int, int]], object]:
    """Per step: sequence id -> tokens the step computes for it (a decode: 1), and the replay's metrics."""
    steps: list[dict[int, int]] = []

    def record(work: StepWork, allocator: Allocator) -> None:
        step = {sequence_id: count for sequence_id, _, count in work.prefills}
        step.update({sequence_id: 1 for sequence_id, _ in work.decodes})
        steps.append(step)

    metrics = replay(trace, config, "paged", on_step=record)
    return steps, metrics


def test_running_first_then_waiting_from_what_is_left(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    # A = 1,000 prompt tokens (3 out), B = 100 (2 out), both at t=0, budget 64, memory ample. v1 gives A the whole
    # budget until its last chunk: steps 1-15 A 64 each (960); step 16 A 40, and B is admitted into the 24 left;
    # step 17 A decodes (1), B takes the other 63; step 18 A decodes, B prefills its last 13 and samples; A is done
    # (3 tokens: steps 16, 17, 18); step 19 B decodes its second token. B never holds blocks it does not compute
    # (v0 admitted it at step 1 and let it wait there for 15 steps).
    trace = make_trace("t", [Request("a", 0.0, 1000, 3), Request("b", 0.0, 100, 2)], source="test")
    config = SimConfig.of(tiny_model, clock_gpu, num_blocks=200, block_size=16, max_model_len=2048,
                          max_batched_tokens=64, prefix_caching=False)
    steps, metrics = scheduled_tokens(trace, config)
    assert steps == [{0: 64}] * 15 + [{0: 40, 1: 24}, {0: 1, 1: 63}, {0: 1, 1: 13}, {1: 1}]
    assert metrics.num_preemptions == 0
    assert metrics.mean_batch_size == pytest.approx((15 + 2 + 2 + 2 + 1) / 19)
    # TTFT: A's first token ends step 16, B's step 18 (a step lasts 1 ms on this GPU)
    assert metrics.mean_ttft_s == pytest.approx((0.016 + 0.018) / 2)


def test_a_later_chunk_preempts_the_last_running_request(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    # 10 blocks of 16, budget 48. A = 128 prompt (8 blocks) + 2 out, B = 32 (2 blocks) + 5 out, at t=0.
    # Step 1: A 48 (3 blocks; its whole prompt fits: 8 <= 10). Step 2: A 48 (6 blocks). Step 3: A 32 (8 blocks),
    # A samples; B passes the gate (2 blocks <= 2 free) and gets 16 of the budget left (1 block; 1 free).
    # Step 4: A decodes position 128 into a 9th block (0 free); B's next 16 tokens need a block: B, the last
    # running request, is preempted (recompute) and the step admits nobody. A finishes (2 tokens) and frees all.
    # Step 5: B again from scratch, 32 tokens, samples; steps 6-9 decode its other 4 tokens.
    trace = make_trace("t", [Request("a", 0.0, 128, 2), Request("b", 0.0, 32, 5)], source="test")
    config = SimConfig.of(tiny_model, clock_gpu, num_blocks=10, block_size=16, max_model_len=256,
                          max_batched_tokens=48, prefix_caching=False)
    steps, metrics = scheduled_tokens(trace, config)
    assert steps == [{0: 48}, {0: 48}, {0: 32, 1: 16}, {0: 1}, {1: 32}, {1: 1}, {1: 1}, {1: 1}, {1: 1}]
    assert metrics.num_preemptions == 1
    assert metrics.completed_requests == 2
    # step 4 preempted: the only saturated step (nothing else waits for memory)
    assert metrics.averaged_over == "saturated"


def test_blocks_cached_at_allocation_serve_a_request_admitted_later_in_the_same_step(
        tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    # A shared system prompt of 64 tokens (4 blocks), then 16 tokens of each request's own; both at t=0, one
    # budget of 8,192. v1 allocates A's 5 blocks and caches its full ones at once, so B, admitted next in the same
    # step, finds the 4 shared blocks (its hit is capped at 79 tokens: 4 blocks) and computes only its last 16.
    requests = [Request("a", 0.0, 80, 1, ("sys",)), Request("b", 0.0, 80, 1, ("sys",))]
    trace = make_trace("t", requests, source="test", segments={"sys": 64})
    config = SimConfig.of(tiny_model, clock_gpu, num_blocks=40, block_size=16, max_model_len=256,
                          max_batched_tokens=8192, prefix_caching=True)
    steps, metrics = scheduled_tokens(trace, config)
    assert steps == [{0: 80, 1: 16}]
    assert (metrics.prefix_cache_queries, metrics.prefix_cache_hits) == (160, 64)


def test_parallel_samples_are_requests_sharing_the_prompt(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    # n = 3 (v1's ParentRequest): three requests of the same 48-token prompt (3 blocks), each sampling 2 tokens.
    # The first computes 48; the others hit the 2 blocks below the prompt's last token (32) and compute 16 each.
    # Step 2 decodes all three.
    trace = make_trace("t", [Request("a", 0.0, 48, 2, (), 3)], source="test")
    config = SimConfig.of(tiny_model, clock_gpu, num_blocks=40, block_size=16, max_model_len=256)
    steps, metrics = scheduled_tokens(trace, config)
    assert [sorted(step.values()) for step in steps] == [[16, 16, 48], [1, 1, 1]]
    assert (metrics.prefix_cache_queries, metrics.prefix_cache_hits) == (144, 64)
    assert metrics.completed_requests == 1
    assert metrics.num_copy_on_writes == 0


def test_long_prefill_threshold_caps_a_request_per_step(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    # long_prefill_token_threshold 30, budget 100: A (120 tokens) gets 30 a step while another request runs or
    # waits; B (30) is admitted into the 70 left in step 1 and prefills whole. Step 2: A 30, B decodes its second
    # and last token. Step 3: A is alone, so the threshold is off (num_eligible_reqs == 1): its last 60 at once.
    trace = make_trace("t", [Request("a", 0.0, 120, 1), Request("b", 0.0, 30, 2)], source="test")
    config = SimConfig.of(tiny_model, clock_gpu, num_blocks=40, block_size=16, max_model_len=256,
                          max_batched_tokens=100, long_prefill_token_threshold=30)
    steps, _ = scheduled_tokens(trace, config)
    assert steps == [{0: 30, 1: 30}, {0: 30, 1: 1}, {0: 60}]


def test_watermark_holds_only_while_something_runs(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    # 20 blocks, watermark 0.1 (2 blocks); a 19-block prompt. v0 keeps the watermark always and rejects it; v1
    # applies it only while something runs, so alone it is admitted (and completes).
    trace = make_trace("t", [Request("a", 0.0, 19 * 16, 1)], source="test")
    v1 = SimConfig.of(tiny_model, clock_gpu, num_blocks=20, block_size=16, max_model_len=512, watermark=0.1)
    assert replay(trace, v1, "paged").completed_requests == 1
    v0 = SimConfig.of(tiny_model, clock_gpu, num_blocks=20, block_size=16, max_model_len=512, watermark=0.1,
                      scheduler="v0")
    assert replay(trace, v0, "paged").rejected_requests == 1


def test_defaults_are_vllm_serves(tiny_model: ModelSpec) -> None:
    # vllm/engine/arg_utils.py EngineArgs.get_batch_defaults, OPENAI_API_SERVER: 8192 tokens / 1024 sequences on
    # a GPU of >= 70 GiB that is not an A100, else 2048 / 256; v1 turns prefix caching on; the watermark is 0.
    assert vllm_serve_batch_defaults(load_gpu("h200")) == (8192, 1024)
    assert vllm_serve_batch_defaults(load_gpu("a100-80gb")) == (2048, 256)
    config = SimConfig.of(tiny_model, load_gpu("h100"), num_blocks=10)
    engine = config.engine
    assert (engine.max_batched_tokens, engine.max_num_seqs, config.cache.prefix_caching, engine.watermark) == \
        (8192, 1024, True, 0.0)
    v0 = SimConfig.of(tiny_model, load_gpu("h100"), num_blocks=10, scheduler="v0")
    assert (v0.engine.max_batched_tokens, v0.engine.max_num_seqs, v0.cache.prefix_caching, v0.engine.watermark) == \
        (None, 256, False, 0.01)


def test_swap_is_v0_only(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    with pytest.raises(InputError, match=r"preemption.*recompute only"):
        SimConfig.of(tiny_model, clock_gpu, num_blocks=10, preemption="swap", cpu_blocks=10)
    SimConfig.of(tiny_model, clock_gpu, num_blocks=10, preemption="swap", cpu_blocks=10, scheduler="v0")


@pytest.mark.parametrize(("args", "expected"), [
    ([], ("v1", 8192, 1024, True, 0.0)),
    (["--no-prefix-caching", "--max-num-seqs", "8"], ("v1", 8192, 8, False, 0.0)),
    (["--scheduler", "v0"], ("v0", None, 256, False, 0.01)),
])
def test_simulate_takes_the_engines_defaults(args: list[str], expected: tuple) -> None:
    # h200 (141 GB, not an A100): vllm serve's 8192 tokens and 1024 sequences in v1; v0's own defaults.
    result = CliRunner().invoke(app, ["simulate", str(ROOT / "traces" / "burst.yaml"), "--strategies", "paged",
                                      "--json", "-", *args])
    assert result.exit_code == 0, result.output
    config = json.loads(result.stdout)["config"]
    assert tuple(config[k] for k in ("scheduler", "max_batched_tokens", "max_num_seqs", "prefix_caching",
                                     "watermark")) == expected
