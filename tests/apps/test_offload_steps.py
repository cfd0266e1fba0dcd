"""run with a host tier (apps/offload_steps.py): the simulator's stores and loads executed on real tensors.

The reference is the cache read by plain indexing: what a block held when the simulator stored its hash must be,
bit for bit, what the block a later hit loads that hash into holds. Write-through stores a step's blocks after
its compute (they hold its K/V only then); on-eviction stores them before the step's compute overwrites them.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from minipaged_cli.apps.offload_steps import StepOffload
from minipaged_cli.apps.run import _Executor, run_trace
from minipaged_cli.cli.main import app
from minipaged_cli.dataplane.backends import TorchBackend
from minipaged_cli.dataplane.kv_cache import PagedKVCache
from minipaged_cli.dataplane.offload import HostKVPool
from minipaged_cli.memory.allocators import Allocator
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import StepWork, replay
from minipaged_cli.workloads.presets import load_gpu, load_model
from minipaged_cli.workloads.trace import Request, make_trace

MODEL = load_model("qwen3-8b")  # loading its 64 tokens beats recomputing them on an H200 (sim/tiers.py)
BLOCK = 16
TRACE_YAML = """\
version: 1
name: returning-prompt
segments: {sys: 64, other: 64}
requests:
  - {id: a, arrival_s: 0.0, prompt_tokens: 65, output_tokens: 1, prefix: [sys]}
  - {id: b, arrival_s: 10.0, prompt_tokens: 65, output_tokens: 1, prefix: [other]}
  - {id: c, arrival_s: 20.0, prompt_tokens: 65, output_tokens: 1, prefix: [sys]}
"""


def returning_prompt():
    """A's 64-token prompt prefix, then B's, then A's again; on a GPU pool of 5 blocks B's allocation evicts A's
    four cached blocks, so C finds them only in the host tier."""
    requests = [Request("a", 0.0, 65, 1, prefix=("sys",)), Request("b", 10.0, 65, 1, prefix=("other",)),
                Request("c", 20.0, 65, 1, prefix=("sys",))]
    return make_trace("returning-prompt", requests, source="test", segments={"sys": 64, "other": 64})


def content(cache: PagedKVCache, block: int) -> torch.Tensor:
    return torch.stack([torch.stack((cache.key_cache[layer][block], cache.value_cache[layer][block]))
                        for layer in range(cache.num_layers)]).clone()


@pytest.mark.parametrize("policy", ["write-through", "on-eviction"])
def test_a_hit_loads_what_the_block_held_when_it_was_stored(policy: str) -> None:
    config = SimConfig.of(MODEL, load_gpu("h200"), num_blocks=5, block_size=BLOCK, cpu_kv_blocks=8,
                          offload_policy=policy)
    backend = TorchBackend("cpu")
    cache = PagedKVCache(2, config.cache.num_blocks, MODEL.num_kv_heads, BLOCK, MODEL.head_dim, torch.float32)
    offload = StepOffload(HostKVPool(cache, backend, config.tiers.cpu_kv_blocks), policy == "write-through")
    executor = _Executor(cache, backend, MODEL.num_q_heads, seed=0, offload=offload)
    stored: dict[object, torch.Tensor] = {}
    loads: list[tuple[object, int]] = []

    def step(work: StepWork, allocator: Allocator) -> None:
        if policy == "on-eviction":  # the evicted blocks' content before this step overwrites it
            stored.update((h, content(cache, b)) for h, b in work.stores)
        executor(work, allocator)
        if policy == "write-through":  # the blocks' content once this step has computed it
            stored.update((h, content(cache, b)) for h, b in work.stores)
        for block_hash, block in work.loads:
            assert torch.equal(content(cache, block), stored[block_hash]), block_hash
        loads.extend(work.loads)

    metrics = replay(returning_prompt(), config, "paged", on_step=step)
    assert len(loads) == 4 and metrics.tiers["cpu"].hit_tokens == 64  # C's four prefix blocks came from host
    stats = offload.stats()
    block_bytes = BLOCK * cache.bytes_per_token
    assert (stats.loaded_blocks, stats.loaded_bytes) == (4, 4 * block_bytes)
    assert stats.stored_blocks == len(stored) and stats.stored_bytes == len(stored) * block_bytes


def test_run_trace_reports_the_host_tiers_copies() -> None:
    config = SimConfig.of(MODEL, load_gpu("h200"), num_blocks=5, block_size=BLOCK, cpu_kv_blocks=8)
    report = run_trace(returning_prompt(), config, TorchBackend("cpu"), num_layers=1, dtype=torch.bfloat16)
    block_bytes = BLOCK * MODEL.num_kv_heads * MODEL.head_dim * 2 * 2  # K and V, one layer, bf16
    assert report.offload is not None
    assert report.offload.loaded_bytes == 4 * block_bytes  # C's four blocks
    assert report.offload.stored_bytes == 8 * block_bytes  # A's four and B's four, after their prefills
    assert report.to_dict()["offload"]["loaded_bytes"] == 4 * block_bytes
    assert report.offload.store_gbps > 0 and report.offload.load_gbps > 0


def test_run_with_cpu_kv_memory_prints_and_writes_the_offload(tmp_path: Path) -> None:
    trace = tmp_path / "returning.yaml"
    trace.write_text(TRACE_YAML)
    block_bytes = BLOCK * MODEL.kv_bytes_per_token
    result = CliRunner().invoke(app, ["run", str(trace), "--device", "cpu", "--model", "qwen3-8b", "--num-layers",
                                      "1", "--num-blocks", "5", "--block-size", str(BLOCK), "--cpu-kv-memory",
                                      str(8 * block_bytes), "--json", "-"])
    assert result.exit_code == 0, result.output
    offload = json.loads(result.stdout)["offload"]
    assert (offload["host_blocks"], offload["loaded_blocks"], offload["stored_blocks"]) == (8, 4, 8)
    assert "KV loaded from host" in result.stderr


@pytest.mark.parametrize(("inclusion", "stores"), [("inclusive", 8), ("exclusive", 16)])
def test_exclusive_tiers_store_a_block_again_each_time_the_gpu_evicts_it(inclusion: str, stores: int) -> None:
    # sys, other, sys, other, sys on a GPU of 5 blocks (each request's 66 tokens take all 5), host tier of 8, the
    # blocks going down as the GPU evicts them. Each request after the first evicts its predecessor's 4 prefix
    # blocks and the one before that finds its 4 in the host tier: 3 x 4 = 12 loads either way. Inclusive: the
    # host tier keeps what it loads, so only the first eviction of sys and of other stores them (4 + 4).
    # Exclusive: a load takes the blocks out of the host tier, so each of the 4 evictions stores 4 (16).
    requests = [Request(str(i), 10.0 * i, 65, 1, prefix=(name,)) for i, name in enumerate(
        ["sys", "other", "sys", "other", "sys"])]
    trace = make_trace("alternating", requests, source="test", segments={"sys": 64, "other": 64})
    config = SimConfig.of(MODEL, load_gpu("h200"), num_blocks=5, block_size=BLOCK, cpu_kv_blocks=8,
                          offload_policy="on-eviction", tier_inclusion=inclusion)
    backend = TorchBackend("cpu")
    cache = PagedKVCache(1, config.cache.num_blocks, MODEL.num_kv_heads, BLOCK, MODEL.head_dim, torch.float32)
    offload = StepOffload(HostKVPool(cache, backend, config.tiers.cpu_kv_blocks), False)
    executor = _Executor(cache, backend, MODEL.num_q_heads, seed=0, offload=offload)
    stored: dict[object, torch.Tensor] = {}
    loads: list[tuple[object, int]] = []

    def step(work: StepWork, allocator: Allocator) -> None:
        stored.update((h, content(cache, b)) for h, b in work.stores)  # before this step overwrites them
        executor(work, allocator)
        for block_hash, block in work.loads:
            assert torch.equal(content(cache, block), stored[block_hash]), block_hash
        loads.extend(work.loads)

    metrics = replay(trace, config, "paged", on_step=step)
    stats = offload.stats()
    block_bytes = BLOCK * cache.bytes_per_token
    assert len(loads) == stats.loaded_blocks == 12
    assert stats.stored_blocks == stores
    # the copies the data plane ran are the ones the simulator's host tier counted (its bytes: every layer's)
    assert metrics.tiers["cpu"].stored_bytes == stores * BLOCK * MODEL.kv_bytes_per_token
    assert stats.stored_bytes == stores * block_bytes
