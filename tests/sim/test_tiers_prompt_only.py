"""Only prompt blocks go below the GPU (vLLM's OffloadingConnector: ``offload_prompt_only``, its default; LMCache's
and Mooncake Store's ``save_decode_cache`` off): output blocks stay in the GPU's prefix cache and are never stored
in a tier, under either policy. A hand-worked two-request trace."""

from __future__ import annotations

import pytest

from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import replay
from minipaged_cli.workloads.presets import load_gpu, load_model
from minipaged_cli.workloads.trace import Request, make_trace

BLOCK = 16
BLOCK_BYTES = BLOCK * 147_456  # Qwen3-8B's KV per token


def two_requests():
    """A: a 64-token prompt and 40 output tokens, so 64 + 40 - 1 = 103 tokens of KV: blocks 0-3 prompt, 4-5 full
    of output (tokens 64-95), 6 partial. B, 10 s later: a 97-token prompt of other content, one output token: 7
    blocks, which on a GPU pool of 7 evict all 6 of A's cached blocks."""
    requests = [Request("a", 0.0, 64, 40, prefix=("sys",)), Request("b", 10.0, 97, 1, prefix=("other",))]
    return make_trace("two", requests, source="test", segments={"sys": 64, "other": 96})


@pytest.mark.parametrize(("policy", "stored_blocks"), [
    ("write-through", 4 + 6),  # A's 4 prompt blocks after its prefill, B's 6 full prompt blocks after its own
    ("on-eviction", 4),  # of A's 6 blocks B's allocation evicts, the 4 prompt ones
])
def test_output_blocks_stay_on_the_gpu(policy: str, stored_blocks: int) -> None:
    config = SimConfig.of(load_model("qwen3-8b"), load_gpu("h200"), num_blocks=7, block_size=BLOCK, cpu_kv_blocks=16,
                          offload_policy=policy)
    metrics = replay(two_requests(), config, "paged")
    assert metrics.num_evictions == 6  # the GPU cached A's output blocks too
    assert metrics.tiers["cpu"].stored_bytes == stored_blocks * BLOCK_BYTES


@pytest.mark.parametrize(("policy", "stored_pages"), [
    ("write-through", 2 * (4 + 6)),  # each of the two groups' pages of A's 4 and B's 6 prompt blocks
    ("on-eviction", 2 * 4),  # of A's 12 cached pages B's allocation evicts, the 8 of prompt blocks
])
def test_output_blocks_stay_on_the_gpu_in_every_kv_cache_group(policy: str, stored_pages: int) -> None:
    # gpt-oss-20b under the hybrid manager: a sliding group (window 128, longer than A's 103 tokens, so it frees
    # nothing) and a full group, each page 16 tokens of 12 layers at 2,048 B. A holds 7 pages a group; B's 7 a
    # group on a pool of 14 evict A's 12 cached ones. The tiers key a page by (group, hash): output pages too.
    config = SimConfig.of(load_model("gpt-oss-20b"), load_gpu("h200"), num_blocks=14, block_size=BLOCK,
                          cpu_kv_blocks=32, offload_policy=policy)
    metrics = replay(two_requests(), config, "paged")
    assert metrics.num_evictions == 12
    assert metrics.tiers["cpu"].stored_bytes == stored_pages * BLOCK * 12 * 2048
