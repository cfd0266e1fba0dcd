"""The simulator with shared blocks and preemption policies: prefix caching and parallel sampling worked by hand,
swap, the watermark, rejection reasons, and Mooncake's published prefix-reuse ceiling."""

from __future__ import annotations

import pytest

from minipaged_cli.errors import InputError
from minipaged_cli.memory.prefix import block_content_keys
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import StepWork, replay
from minipaged_cli.workloads.presets import GpuSpec, ModelSpec, load_gpu, load_model
from minipaged_cli.workloads.readers import load_trace
from minipaged_cli.workloads.trace import Request, make_trace
from tests.conftest import ROOT, shared_trace


def v0_config(*args: object, **options: object) -> SimConfig:
    """The cases below that are worked by hand for vLLM v0's scheduling (whole prompts reserved at admission,
    samples forked, swap); v1's are in test_scheduler.py."""
    return SimConfig.of(*args, scheduler="v0", **options)  # type: ignore[arg-type]


def test_prefix_cache_by_hand(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    # Block 4, 100 blocks (400 slots). Two requests at t=0, each a 32-token shared segment + 8 own tokens, output 3.
    # Step 1 admits A (10 blocks, its 8 segment blocks cached) then B, which finds those 8 blocks: it allocates 2.
    # Distinct slots in use: 48, 56, 56 over the 3 steps; tokens 80-32, 82-32, 84-32 = 48, 50, 52.
    trace = make_trace("t", [Request("a", 0.0, 40, 3, ("sys",)), Request("b", 0.0, 40, 3, ("sys",))],
                       source="test", segments={"sys": 32})
    config = v0_config(tiny_model, clock_gpu, num_blocks=100, block_size=4, max_model_len=64, prefix_caching=True,
                       check_invariants=True)
    cached = replay(trace, config, "paged")
    assert (cached.prefix_cache_queries, cached.prefix_cache_hits) == (80, 32)
    assert cached.prefix_cache_hit_pct == pytest.approx(40.0)
    assert cached.token_state_pct == pytest.approx(100 * 50 / 400)
    assert cached.kv_cache_usage_perc == pytest.approx(100 * (48 + 56 + 56) / 3 / 400)
    assert cached.internal_frag_pct == pytest.approx(100 * (0 + 4 + 4) / 3 / 400)  # each own tail: 44 - 42
    assert cached.reserved_future_pct == pytest.approx(100 * (0 + 2 + 0) / 3 / 400)
    assert cached.invariant_violations == 0 and cached.completed_requests == 2
    # Without prefix caching both hold all 10-11 blocks; nothing is looked up.
    plain = replay(trace, v0_config(tiny_model, clock_gpu, num_blocks=100, block_size=4, max_model_len=64), "paged")
    assert (plain.prefix_cache_queries, plain.prefix_cache_hits, plain.prefix_cache_hit_pct) == (0, 0, 0.0)
    assert plain.token_state_pct == pytest.approx(100 * (80 + 82 + 84) / 3 / 400)
    assert plain.kv_cache_usage_perc == pytest.approx(100 * (80 + 88 + 88) / 3 / 400)


def test_a_re_prefill_after_preemption_is_not_a_query(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    # 6 blocks of 2: A and B share a 4-token segment and each grow a block every two tokens, so B (admitted last)
    # is preempted and prefills again; the hit and query counts are those of the first admissions only.
    trace = make_trace("t", [Request("a", 0.0, 5, 6, ("sys",)), Request("b", 0.0, 5, 6, ("sys",))],
                       source="test", segments={"sys": 4})
    config = v0_config(tiny_model, clock_gpu, num_blocks=6, block_size=2, max_model_len=16, prefix_caching=True,
                       check_invariants=True)
    result = replay(trace, config, "paged", bulk=False)
    assert result.num_preemptions >= 1 and result.completed_requests == 2
    assert (result.prefix_cache_queries, result.prefix_cache_hits) == (10, 4)  # B found A's two segment blocks
    assert result.invariant_violations == 0


def test_content_keys_are_equal_exactly_for_equal_content_so_far() -> None:
    # block 4: [a a a a] [a b b b] [b b b b] | [a a a a] [a c c c] [c c c c]: only the first block's content agrees
    first = block_content_keys([("a", 5), ("b", 7)], 4)
    second = block_content_keys([("a", 5), ("c", 7)], 4)
    assert len(first) == len(second) == 3
    assert first[0] == second[0] and first[1] != second[1] and first[2] != second[2]
    # the same 8 tokens of "a" split differently (5 + 3 vs one run of 8) are different segments, different content
    assert block_content_keys([("a", 5), ("x", 3)], 4)[1] != block_content_keys([("a", 8)], 4)[1]
    # a run past the last full block leaves no key, and empty runs change nothing
    assert block_content_keys([("a", 5), ("e", 0), ("b", 7)], 4) == first
    assert block_content_keys([("a", 3)], 4) == []


def test_a_recomputed_request_finds_its_own_blocks_still_cached(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    # Same squeeze as above without any shared segment: B is preempted; with prefix caching its re-prefill starts
    # at its first block that is no longer cached, without it at position 0.
    trace = make_trace("t", [Request("a", 0.0, 5, 6), Request("b", 0.0, 5, 6)], source="test")
    starts = {}
    for caching in (False, True):
        config = v0_config(tiny_model, clock_gpu, num_blocks=6, block_size=2, max_model_len=16,
                           prefix_caching=caching, check_invariants=True)
        prefills: list[tuple[int, int, int]] = []

        def record(work: StepWork, allocator, prefills=prefills) -> None:
            prefills.extend(work.prefills)

        result = replay(trace, config, "paged", on_step=record)
        assert result.num_preemptions >= 1 and result.completed_requests == 2 and result.invariant_violations == 0
        starts[caching] = [start for sequence, start, _ in prefills if sequence == 1]
        assert result.prefix_cache_hits == 0  # its own tokens are never a hit: only other requests' can be
    assert len(starts[False]) >= 2 and starts[False][1:] == [0] * (len(starts[False]) - 1)
    assert any(start > 0 for start in starts[True][1:])


def test_parallel_sampling_by_hand(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    # n = 3, prompt 6, output 3, block 4, 40 slots. Step 1 prefills 6 tokens (2 blocks); 2 samples fork.
    # Step 2: the first two writers copy the shared, half-filled block 1 (2 copy-on-writes), the third writes in
    # place: block 0 shared 3 ways + 3 last blocks = 16 slots, tokens 21 - 2 x 4 = 13. Step 3: 16 slots, 16 tokens.
    trace = make_trace("t", [Request("a", 0.0, 6, 3, (), 3)], source="test")
    config = v0_config(tiny_model, clock_gpu, num_blocks=10, block_size=4, max_model_len=64, check_invariants=True)
    paged = replay(trace, config, "paged")
    assert paged.num_copy_on_writes == 2
    assert paged.token_state_pct == pytest.approx(100 * (6 + 13 + 16) / 3 / 40)
    assert paged.kv_cache_usage_perc == pytest.approx(100 * (8 + 16 + 16) / 3 / 40)
    assert paged.completed_requests == 1 and paged.throughput_tokens_per_s == pytest.approx(9 / 0.003)
    assert paged.mean_ttft_s == pytest.approx(0.001) and paged.mean_tpot_s == pytest.approx(0.001)
    # Contiguous: every sample copies the prompt into an extent of its own (oracle: 9 slots each).
    oracle = replay(trace, config, "oracle-reserve")
    assert oracle.token_state_pct == pytest.approx(100 * (6 + 21 + 24) / 3 / 40)
    assert oracle.kv_cache_usage_perc == pytest.approx(100 * (9 + 27 + 27) / 3 / 40)
    assert oracle.completed_requests == 1 and oracle.num_copy_on_writes == 0


def test_a_sample_with_no_room_to_fork_prefills_later(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    # oracle-reserve, 20 slots: the leader's extent holds 9; one more fits, the third sample waits and prefills.
    trace = make_trace("t", [Request("a", 0.0, 6, 3, (), 3)], source="test")
    config = v0_config(tiny_model, clock_gpu, num_blocks=20, block_size=1, max_model_len=64, check_invariants=True)
    oracle = replay(trace, config, "oracle-reserve")
    assert oracle.completed_requests == 1 and oracle.rejected_requests == 0
    assert oracle.makespan_s > 0.003  # the third sample ran after the others freed their extents


def test_swap_moves_the_victims_kv_out_and_back(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    # 4 blocks of 2: A and B each grow a block every two tokens; B, admitted last, is preempted.
    trace = make_trace("t", [Request("a", 0.0, 2, 6), Request("b", 0.0, 2, 6)], source="test")
    swap = v0_config(tiny_model, clock_gpu, num_blocks=4, block_size=2, max_model_len=16, preemption="swap",
                     cpu_blocks=8, check_invariants=True)
    swapped = replay(trace, swap, "paged", bulk=False)
    assert swapped.num_swaps == swapped.num_preemptions >= 1
    assert swapped.swap_out_bytes == swapped.swap_in_bytes > 0
    assert swapped.swap_out_bytes % (2 * tiny_model.kv_bytes_per_token) == 0  # whole blocks move
    assert swapped.completed_requests == 2 and swapped.invariant_violations == 0
    recompute = replay(trace, v0_config(tiny_model, clock_gpu, num_blocks=4, block_size=2, max_model_len=16),
                       "paged", bulk=False)
    assert recompute.num_swaps == 0 and recompute.swap_out_bytes == 0 and recompute.num_preemptions >= 1
    with pytest.raises(InputError, match="cpu_blocks"):
        v0_config(tiny_model, clock_gpu, num_blocks=4, block_size=2, preemption="swap")


def test_watermark_keeps_blocks_free_at_admission(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    # 10 blocks of 4, watermark 0.2 = 2 blocks: a 33-token prompt (9 blocks) can never be admitted, 32 can.
    trace = make_trace("t", [Request("big", 0.0, 33, 2), Request("ok", 0.0, 32, 2)], source="test")
    config = v0_config(tiny_model, clock_gpu, num_blocks=10, block_size=4, max_model_len=64, watermark=0.2)
    result = replay(trace, config, "paged")
    assert (result.completed_requests, result.rejected_requests) == (1, 1)
    assert result.rejection_reasons == {"its prompt needs more blocks than the pool has above the watermark": 1}
    assert replay(trace, v0_config(tiny_model, clock_gpu, num_blocks=10, block_size=4, max_model_len=64),
                  "paged").completed_requests == 2


@pytest.mark.parametrize("options", [{}, {"preemption": "swap", "cpu_blocks": 2}, {"watermark": 0.25},
                                     {"prefix_caching": True}], ids=["recompute", "swap", "watermark", "prefix"])
def test_a_cache_too_small_for_anything_ends_with_every_request_rejected(tiny_model: ModelSpec, clock_gpu: GpuSpec,
                                                                         options: dict) -> None:
    # 8 slots: no request's prompt + output fits, and one is larger than the whole pool by far.
    trace = make_trace("t", [Request("a", 0.0, 6, 10), Request("b", 0.0, 3, 20, (), 2), Request("c", 0.1, 100, 5)],
                       source="test")
    config = v0_config(tiny_model, clock_gpu, num_blocks=4, block_size=2, max_model_len=512, **options)
    for strategy in ("paged", "oracle-reserve", "dynamic"):
        result = replay(trace, config, strategy)
        assert (result.completed_requests, result.rejected_requests) == (0, 3), strategy
        assert sum(result.rejection_reasons.values()) == 3


def mooncake_ceiling(requests: tuple[Request, ...], segments: dict[str, int]) -> float:
    """Prompt tokens whose 512-token segment an earlier request already had, over all prompt tokens."""
    seen: set[str] = set()
    hits = 0
    for request in requests:
        hits += sum(segments[s] for s in request.prefix if s in seen)
        seen.update(request.prefix)
    return hits / sum(r.prompt_tokens for r in requests)


@pytest.mark.slow
def test_mooncake_hit_rate_reaches_the_ceiling_and_evicts_in_a_small_pool() -> None:
    trace = load_trace(shared_trace("mooncake_conversation_trace.jsonl"), limit=1500)
    ceiling = 100 * mooncake_ceiling(trace.requests, trace.segments)
    model, gpu = load_model("qwen3-8b"), load_gpu("h200")
    unbounded = -(-(trace.prompt_tokens + trace.output_tokens) // 16)
    config = SimConfig.of(model, gpu, num_blocks=unbounded, block_size=16, max_model_len=131072, prefix_caching=True)
    full = replay(trace, config, "paged")
    assert full.prefix_cache_hit_pct <= ceiling + 1e-9
    assert full.prefix_cache_hit_pct == pytest.approx(ceiling, abs=1.0)
    assert full.num_evictions == 0 and full.completed_requests == 1500
    # A tenth of the distinct prefix blocks: cached blocks are evicted before the next turn of their conversation.
    distinct = len({s for r in trace.requests for s in r.prefix}) * 512 // 16
    small = replay(trace, SimConfig.of(model, gpu, num_blocks=distinct // 10, block_size=16, max_model_len=131072,
                                       prefix_caching=True), "paged")
    assert small.prefix_cache_hit_pct < full.prefix_cache_hit_pct
    assert small.num_evictions > 0 and small.completed_requests == 1500


class ComputedContent:
    """An ``on_step`` data model for prefix caching: which content each physical block holds, known only once a
    step has written the block's last token. Every token a step reads (a prefill chunk's earlier positions, a
    decode's context) lies in full blocks that must hold exactly the content its key names: a prefix-cache hit
    on a block that no step ever computed reads garbage, and fails here."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.content: dict[int, object] = {}  # physical block -> content key of the tokens written there
        self.checked_tokens = 0

    def __call__(self, work: StepWork, allocator) -> None:
        sequences = allocator.manager.sequences
        for _, dst in work.copies:
            self.content.pop(dst, None)  # a partly filled block: its content has no key yet
        writes = [*work.prefills, *((sid, position, 1) for sid, position in work.decodes)]
        for sid, start, count in writes:  # the step writes every new token before any attention reads
            state = sequences[sid]
            for logical in range(start // self.block_size, (start + count) // self.block_size):
                if (logical + 1) * self.block_size > start and logical < len(state.block_hashes):
                    self.content[state.block_table[logical]] = state.block_hashes[logical]
        for sid, start, _ in writes:
            state = sequences[sid]
            for logical in range(min(start // self.block_size, len(state.block_hashes))):
                block = state.block_table[logical]
                assert self.content.get(block) == state.block_hashes[logical], (
                    f"sequence {sid} reads block {block} (its logical block {logical}) before any step computed "
                    "that content there")
                self.checked_tokens += self.block_size


@pytest.mark.slow
def test_a_request_preempted_mid_prefill_leaves_no_uncomputed_block_in_the_cache() -> None:
    # The audit's case: the Azure conversation sample with prefix caching and chunked prefill on a pool small
    # enough to preempt mid-prefill (Qwen3-8B, H100, 250 blocks, 512 tokens a step). Before the fix, admission
    # cached every block of the reserved prompt, so a re-admitted request skipped ~600 tokens no step had computed.
    # Its first 300 requests preempt 96 times (all 1,000: 82,000 steps, each checked, 25 s).
    trace = load_trace(ROOT / "traces" / "azure_conv_1k.yaml").limited(300)
    config = SimConfig.of(load_model("qwen3-8b"), load_gpu("h100"), num_blocks=250, block_size=16,
                          max_batched_tokens=512, prefix_caching=True, check_invariants=True)
    model = ComputedContent(config.block_size)
    result = replay(trace, config, "paged", on_step=model)
    assert result.num_preemptions > 0 and model.checked_tokens > 0
    assert result.invariant_violations == 0


def test_ttft_and_tpot_are_absent_when_no_request_completed(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    trace = make_trace("t", [Request("a", 0.0, 8, 50)], source="test")
    config = v0_config(tiny_model, clock_gpu, num_blocks=100, block_size=4, max_model_len=64)
    cut = replay(trace, config, "paged", bulk=False, max_steps=3)  # still decoding when the replay stops
    assert cut.completed_requests == 0
    assert (cut.mean_ttft_s, cut.p99_ttft_s, cut.mean_tpot_s) == (None, None, None)
    document = cut.to_dict()
    assert document["mean_ttft_s"] is None and document["mean_tpot_s"] is None
    one_token = replay(make_trace("t", [Request("a", 0.0, 8, 1)], source="test"), config, "paged")
    assert one_token.mean_ttft_s == pytest.approx(0.001) and one_token.mean_tpot_s is None  # no second token
