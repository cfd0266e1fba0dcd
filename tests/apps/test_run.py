"""``minipaged run``'s engine: every attention call it makes, checked against a dense copy of each sequence's K/V.

A recording backend sees every cache write (which tokens, which slots) and every attention call; the test maps
each written token to its (sequence, position) from the step's work, keeps a dense history per sequence, and
recomputes each decode's attention with PyTorch's SDPA over that history. A wrong slot, a block table pointing at
another sequence's block, a position read before it was written (the cache starts as NaN), or stale K/V after a
preemption all show up as a mismatch.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F
from typer.testing import CliRunner

from minipaged_cli.apps.run import _Executor, run_trace
from minipaged_cli.cli.main import app
from minipaged_cli.dataplane.backends import TorchBackend
from minipaged_cli.dataplane.kv_cache import PagedKVCache
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import StepWork, replay
from minipaged_cli.workloads.presets import GpuSpec, ModelSpec
from minipaged_cli.workloads.trace import Request, make_trace
from tests.conftest import ROOT

MODEL = ModelSpec(name="small", num_layers=2, hidden_size=64, intermediate_size=64, num_q_heads=4, num_kv_heads=2,
                  head_dim=16, vocab_size=64, tie_word_embeddings=True, gated_mlp=True, dtype="float32",
                  max_model_len=512)
GPU = GpuSpec(name="clock", memory_bytes=1e12, hbm_bandwidth_bytes_per_s=1e30, peak_flops=1e30,
              step_overhead_s=0.001)


class RecordingBackend(TorchBackend):
    def __init__(self) -> None:
        super().__init__("cpu")
        self.writes: list[tuple[torch.Tensor, torch.Tensor]] = []  # layer 0: (key, value) of each call, in order
        self.attention_calls: list[tuple[torch.Tensor, torch.Tensor]] = []  # layer 0: (query, out)

    def _cache_write(self, key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale) -> None:
        super()._cache_write(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale)
        if key_cache.data_ptr() == self.layer0:
            self.writes.append((key.clone(), value.clone()))

    def _paged_attention(self, query, key_cache, value_cache, block_tables, seq_lens, scale, k_scale, v_scale):
        out = super()._paged_attention(query, key_cache, value_cache, block_tables, seq_lens, scale, k_scale,
                                       v_scale)
        if key_cache.data_ptr() == self.layer0:
            self.attention_calls.append((query.clone(), out))
        return out


def checked_replay(requests: list[tuple], num_blocks: int, block_size: int,
                   max_batched_tokens: int | None, scheduler: str) -> tuple[int, int, int]:
    """(decodes checked, preemptions, copy-on-writes); a request is (arrival, prompt, output[, prefix, n])."""
    trace = make_trace("t", [Request(f"r{i}", *r) for i, r in enumerate(requests)], source="test")
    config = SimConfig.of(MODEL, GPU, num_blocks=num_blocks, block_size=block_size, max_model_len=512,
                          max_batched_tokens=max_batched_tokens, scheduler=scheduler)
    cache = PagedKVCache(2, num_blocks, MODEL.num_kv_heads, block_size, MODEL.head_dim, torch.float32)
    for tensor in (*cache.key_cache, *cache.value_cache):
        tensor.fill_(float("nan"))  # anything read before it is written poisons the output
    backend = RecordingBackend()
    backend.layer0 = cache.key_cache[0].data_ptr()
    executor = _Executor(cache, backend, MODEL.num_q_heads, seed=5)
    history: dict[int, dict[int, tuple[torch.Tensor, torch.Tensor]]] = {}
    checked = 0

    def on_step(work: StepWork, allocator) -> None:
        nonlocal checked
        writes_before, calls_before = len(backend.writes), len(backend.attention_calls)
        for parent, child in work.forks:  # a forked sample starts with its parent's history
            history[child] = dict(history[parent])
        executor(work, allocator)
        keys = torch.cat([k for k, _ in backend.writes[writes_before:]]) if work.prefills or work.decodes else None
        values = torch.cat([v for _, v in backend.writes[writes_before:]]) if keys is not None else None
        tokens = [(s, p) for s, start, n in work.prefills for p in range(start, start + n)] + list(work.decodes)
        assert keys is None or len(tokens) == len(keys)
        for index, (sequence, position) in enumerate(tokens):
            if position == 0:
                history[sequence] = {}  # a (re)started sequence: recompute after preemption rewrites it all
            history[sequence][position] = (keys[index], values[index])
        if work.decodes:
            query, out = backend.attention_calls[calls_before]
            assert out.isfinite().all(), "attention read a slot that was never written"
            for row, (sequence, position) in enumerate(work.decodes):
                k = torch.stack([history[sequence][p][0] for p in range(position + 1)]).transpose(0, 1)
                v = torch.stack([history[sequence][p][1] for p in range(position + 1)]).transpose(0, 1)
                group = MODEL.num_q_heads // MODEL.num_kv_heads
                expected = F.scaled_dot_product_attention(
                    query[row][:, None, :], k.repeat_interleave(group, 0), v.repeat_interleave(group, 0),
                    scale=MODEL.head_dim ** -0.5)[:, 0]
                torch.testing.assert_close(out[row], expected, rtol=2e-5, atol=2e-5)
                checked += 1

    metrics = replay(trace, config, "paged", on_step=on_step)
    assert metrics.completed_requests == len(requests)
    assert executor.block_copies == metrics.num_copy_on_writes
    return checked, metrics.num_preemptions, metrics.num_copy_on_writes


@pytest.mark.slow
@pytest.mark.parametrize(("scheduler", "max_batched_tokens"), [("v0", None), ("v0", 24), ("v1", 24), ("v1", 2048)])
@pytest.mark.parametrize("block_size", [1, 4, 16])
def test_every_attention_call_matches_a_dense_reference(block_size: int, max_batched_tokens: int | None,
                                                        scheduler: str) -> None:
    # v1 also turns prefix caching on: a recomputed request reads back its own cached blocks.
    requests = [(0.0, 30, 12), (0.0, 7, 20), (0.001, 45, 6), (0.002, 3, 25), (0.004, 60, 9), (0.02, 11, 14)]
    checked, preemptions, _ = checked_replay(requests, num_blocks=128 // block_size, block_size=block_size,
                                             max_batched_tokens=max_batched_tokens, scheduler=scheduler)
    # Every decode was checked: O - 1 per request, less one for each re-prefill that sampled a token.
    assert checked >= sum(output - 1 for _, _, output in requests) - preemptions
    assert preemptions > 0  # the pool of 128 slots is too small for all at once: recompute happens


@pytest.mark.parametrize("block_size", [4, 16])
def test_forked_samples_read_their_own_tokens_after_copy_on_write(block_size: int) -> None:
    # n = 3 samples per request share the prompt's blocks; the partly filled last block is copied on the first
    # decode. Without the copy, the samples' first tokens land in one shared slot and all but one read the wrong K/V.
    requests = [(0.0, 30, 12, (), 3), (0.0, 7, 20, (), 2), (0.003, 45, 6, (), 4), (0.01, 11, 14)]
    checked, _, copies = checked_replay(requests, num_blocks=512 // block_size, block_size=block_size,
                                        max_batched_tokens=None, scheduler="v0")
    assert copies > 0
    assert checked >= 3 * 11 + 2 * 19 + 4 * 5 + 13


def test_report_counts_tokens_and_bytes() -> None:
    requests = [(0.0, 20, 5), (0.0, 10, 3)]
    trace = make_trace("t", [Request(f"r{i}", *r) for i, r in enumerate(requests)], source="test")
    config = SimConfig.of(MODEL, GPU, num_blocks=64, block_size=4, max_model_len=512)
    report = run_trace(trace, config, TorchBackend("cpu"), num_layers=2, dtype=torch.float32)
    assert report.prompt_tokens == 30
    assert report.decode_tokens == (5 - 1) + (3 - 1)  # the first output token comes from the prefill
    token_bytes = MODEL.num_kv_heads * MODEL.head_dim * 4  # K or V of one token in one layer
    assert report.cache_write_bytes == 2 * (30 + 6) * token_bytes * 2
    # decode attention reads positions 0..p for each decode: r0 at 20..23, r1 at 10..11 (seq_len = p + 1)
    read_tokens = sum(range(21, 25)) + sum(range(11, 13))
    assert report.attention_bytes == 2 * read_tokens * token_bytes * 2
    assert report.kv_pool_bytes == 2 * 2 * 64 * 4 * MODEL.num_kv_heads * MODEL.head_dim * 4
    assert report.steps == 5 and report.num_preemptions == 0
    assert set(report.to_dict()) == {"device", "backend", "steps", "prompt_tokens", "decode_tokens", "wall_s",
                                     "decode_tokens_per_s", "attention_s", "cache_write_s", "attention_gbps",
                                     "cache_write_gbps", "token_state_pct", "kv_cache_usage_perc", "averaged_over",
                                     "kv_pool_bytes",
                                     "peak_memory_bytes", "num_preemptions", "block_copies", "copy_s"}


def test_run_command_on_cpu() -> None:
    result = CliRunner().invoke(app, ["run", str(ROOT / "traces" / "burst.yaml"), "--device", "cpu",
                                      "--kv-memory", "1GiB", "--max-steps", "15", "--json", "-"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["device"] == "cpu" and document["steps"] == 15
    assert document["prompt_tokens"] > 0 and document["decode_tokens"] > 0
    assert "stopped at --max-steps 15" in " ".join(result.stderr.split())


@pytest.mark.parametrize(("args", "needle"), [
    (["--num-layers", "99"], "--num-layers: 99: must be in [1, 36]"),
    (["--dtype", "int8"], "--dtype: 'int8'"),
    (["--device", "tpu"], "--device: 'tpu'"),
])
def test_run_bad_input(args: list[str], needle: str) -> None:
    result = CliRunner().invoke(app, ["run", str(ROOT / "traces" / "burst.yaml"), *args])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [f"error: {needle}" + result.stderr.strip().split(needle, 1)[1]]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_device_cuda_without_a_gpu_is_one_line() -> None:
    result = CliRunner().invoke(app, ["run", str(ROOT / "traces" / "burst.yaml"), "--device", "cuda"])
    assert result.exit_code == 2
    assert result.stderr.strip() == ("error: --device: 'cuda': the CUDA backend cannot run: torch sees no GPU; "
                                     "use --device cpu or emulated")


def test_forked_samples_count_their_shared_tokens_once() -> None:
    # The audit's case, worked by hand: block 16, 24 blocks (384 slots), a 64-token prompt with n = 4 and 3 output
    # tokens, every step 1 ms. Step 1 prefills 64 tokens (4 blocks); 3 samples fork, sharing those 4 blocks;
    # steps 2 and 3 each decode 4 tokens (step 2 takes one new block per sample). Distinct tokens after each step:
    # 64, 4 * 65 - 3 * 64 = 68, 4 * 66 - 3 * 64 = 72; distinct slots in use: 64, then 4 shared + 4 own blocks = 128.
    # (v0's forks: v1 runs the samples as requests sharing the prompt through the prefix cache.)
    trace = make_trace("fork", [Request("a", 0.0, 64, 3, n=4)], source="test")
    config = SimConfig.of(MODEL, GPU, num_blocks=24, block_size=16, max_model_len=512, scheduler="v0")
    report = run_trace(trace, config, TorchBackend("cpu"), num_layers=1, dtype=torch.float32)
    assert report.token_state_pct == pytest.approx(100 * (64 + 68 + 72) / 3 / 384)
    assert report.kv_cache_usage_perc == pytest.approx(100 * (64 + 128 + 128) / 3 / 384)
    assert report.token_state_pct <= report.kv_cache_usage_perc  # a token needs a slot
    # the same numbers as simulate's, from the same definitions
    simulated = replay(trace, config, "paged")
    assert (report.token_state_pct, report.kv_cache_usage_perc) == pytest.approx(
        (simulated.token_state_pct, simulated.kv_cache_usage_perc))
    assert report.per_step["live_tokens"] == [64, 68, 72]
