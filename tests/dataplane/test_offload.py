"""KV offloading's data plane (dataplane/offload.py): blocks stored to the host pool and loaded back, on the torch
backend and the emulated kernels of cuda/offload.cu, in both host layouts; and on a GPU (pytest -m gpu), the side
stream's ordering with the compute stream.

The reference is the cache itself: a block loaded back must hold, bit for bit, what the original block held when
it was stored (a copy taken by plain indexing before the store), whatever was written over the original since.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

from minipaged_cli.dataplane import kernels
from minipaged_cli.dataplane.backends import Backend, TorchBackend
from minipaged_cli.dataplane.kv_cache import PagedKVCache
from minipaged_cli.dataplane.offload import LAYOUTS, HostKVPool
from tests.conftest import REQUIRE_GPU, REQUIRE_SHARED, skip_unless_required

NUM_LAYERS, NUM_BLOCKS, NUM_KV_HEADS, BLOCK_SIZE = 3, 12, 2, 4


def filled_cache(dtype: torch.dtype, head_dim: int, device: str = "cpu", seed: int = 0) -> PagedKVCache:
    cache = PagedKVCache(NUM_LAYERS, NUM_BLOCKS, NUM_KV_HEADS, BLOCK_SIZE, head_dim, dtype, device)
    generator = torch.Generator().manual_seed(seed)
    for tensor in (*cache.key_cache, *cache.value_cache):
        tensor.copy_(torch.randn(tensor.shape, generator=generator).to(dtype))
    return cache


def blocks_of(cache: PagedKVCache, block_ids: list[int]) -> torch.Tensor:
    """[len(block_ids), num_layers, 2, ...] by plain indexing, one block at a time: the reference."""
    return torch.stack([torch.stack([torch.stack((cache.key_cache[layer][b], cache.value_cache[layer][b]))
                                     for layer in range(cache.num_layers)]) for b in block_ids]).cpu()


def emulated_backend() -> Backend:
    from minipaged_cli.dataplane.emulation import EmulatedBackend

    return EmulatedBackend()


BACKENDS = {"torch": lambda: TorchBackend("cpu"), "emulated": emulated_backend}


@pytest.mark.native_build
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("backend_name", list(BACKENDS))
@pytest.mark.parametrize(("dtype", "head_dim"), [(torch.bfloat16, 64), (torch.float32, 8), (torch.float16, 3),
                                              (torch.float8_e4m3fn, 16)],
                         ids=["bf16-64", "f32-8", "f16-3 (no 16-byte vectors)", "fp8-16 (--kv-cache-dtype fp8)"])
def test_store_then_load_into_other_blocks_is_bit_exact(layout: str, backend_name: str, dtype: torch.dtype,
                                                        head_dim: int) -> None:
    cache = filled_cache(dtype, head_dim)
    pool = HostKVPool(cache, BACKENDS[backend_name](), num_slots=6, layout=layout)
    stored = [("a", 7), ("b", 2), ("c", 10)]
    expected = blocks_of(cache, [b for _, b in stored])
    transfer = pool.store(stored)
    assert (transfer.num_blocks, transfer.num_bytes) == (3, 3 * BLOCK_SIZE * cache.bytes_per_token)
    assert transfer.num_copies == (3 if layout == "contiguous" else 3 * 2 * NUM_LAYERS)
    for tensor in (*cache.key_cache, *cache.value_cache):  # the originals are reused for other tokens
        tensor.fill_(-1)
    loaded = pool.load([("c", 0), ("a", 5), ("b", 11)])
    assert loaded.num_blocks == 3
    assert torch.equal(blocks_of(cache, [5, 11, 0]), expected)
    assert bool((blocks_of(cache, [1, 2, 3, 4, 6]) == -1).all())  # no other block written
    assert pool.bytes_moved == {"store": transfer.num_bytes, "load": loaded.num_bytes}


def test_both_layouts_hold_identical_data_and_load_it_back_alike() -> None:
    results = {}
    for layout in LAYOUTS:
        cache = filled_cache(torch.bfloat16, 16, seed=3)
        pool = HostKVPool(cache, TorchBackend("cpu"), num_slots=4, layout=layout)
        pool.store([(("seq", 0), 4), (("seq", 1), 9)])
        host = torch.stack([pool.host_block(("seq", 0)), pool.host_block(("seq", 1))])
        pool.load([(("seq", 1), 0), (("seq", 0), 1)])
        results[layout] = (host, blocks_of(cache, [0, 1]))
    (host_a, loaded_a), (host_b, loaded_b) = results.values()
    assert torch.equal(host_a, host_b)
    assert torch.equal(loaded_a, loaded_b)
    assert torch.equal(loaded_a, host_a.flip(0))  # seq 1 went to block 0, seq 0 to block 1


@pytest.mark.native_build
@pytest.mark.parametrize("backend_name", list(BACKENDS))
def test_attention_over_loaded_blocks_equals_attention_over_the_originals(backend_name: str) -> None:
    backend = BACKENDS[backend_name]()
    cache = filled_cache(torch.bfloat16, 64, seed=1)
    pool = HostKVPool(cache, backend, num_slots=8)
    original = [3, 8, 1]  # one sequence of 11 tokens: 3 blocks
    pool.store([(f"h{i}", b) for i, b in enumerate(original)])
    moved = [0, 11, 6]
    pool.load([(f"h{i}", b) for i, b in enumerate(moved)])
    query = torch.randn(1, 4, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    seq_lens = torch.tensor([11], dtype=torch.int32)
    for layer in range(NUM_LAYERS):
        outs = [backend.paged_attention(query, cache.key_cache[layer], cache.value_cache[layer],
                                        torch.tensor([table], dtype=torch.int32), seq_lens, 0.125)
                for table in (original, moved)]
        assert torch.equal(outs[0], outs[1])  # the same K/V through the same kernel: the same bits


def test_an_unknown_hash_or_a_full_pool_fails_and_changes_nothing() -> None:
    cache = filled_cache(torch.float32, 8)
    pool = HostKVPool(cache, TorchBackend("cpu"), num_slots=3)
    pool.store([("a", 0), ("b", 1)])
    before_cache = blocks_of(cache, list(range(NUM_BLOCKS)))
    before = (dict(pool.slots), list(pool.free_slots), pool.host.clone(), dict(pool.bytes_moved))

    def unchanged() -> bool:  # the host pool's bits: its free slots hold whatever the memory held, NaN included
        return (pool.slots == before[0] and pool.free_slots == before[1]
                and torch.equal(pool.host.view(torch.int32), before[2].view(torch.int32))
                and pool.bytes_moved == before[3] and torch.equal(blocks_of(cache, list(range(NUM_BLOCKS))),
                                                                  before_cache))

    with pytest.raises(ValueError, match="'zzz': not in the host pool"):
        pool.load([("a", 5), ("zzz", 6)])  # a known hash first: nothing of it may be copied either
    assert unchanged()
    with pytest.raises(ValueError, match="1 free slots of 3"):
        pool.store([("c", 2), ("d", 3)])
    assert unchanged()
    with pytest.raises(ValueError, match=f"GPU block {NUM_BLOCKS}: outside"):
        pool.store([("c", NUM_BLOCKS)])
    assert unchanged()
    with pytest.raises(ValueError, match="one GPU block twice"):
        pool.load([("a", 4), ("b", 4)])
    assert unchanged()
    # stored hashes are not stored again; a discarded one frees its slot
    assert pool.store([("a", 9), ("b", 9)]).num_blocks == 0
    pool.discard(["a", "never stored"])
    assert "a" not in pool and pool.num_free_slots == 2
    assert pool.store([("c", 2), ("d", 3)]).num_blocks == 2


@pytest.mark.native_build
def test_offload_kernels_compile_with_nvcc_for_sm_90(tmp_path) -> None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        skip_unless_required("nvcc is not installed", REQUIRE_SHARED)
    result = subprocess.run([nvcc, "-arch=sm_90", "-cubin", "-O3", "-Xptxas", "-v", "-o",
                             str(tmp_path / "offload.cubin"), str(kernels.CUDA_DIR / "offload.cu")],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr.lower(), result.stderr
    assert "0 bytes spill stores" in result.stderr and "gather_blocks" in result.stderr


# -- on a GPU (pytest -m gpu; skipped elsewhere) ------------------------------------------------------------
# A missing event shows here as wrong data: the GPU is made to hold back the work the other stream must wait for
# (torch.cuda._sleep), so a copy that does not wait reads what was there before. compute-sanitizer cannot see
# it (its racecheck covers shared memory, not two streams on global memory); the CPU tests cannot either (every
# copy there finishes before the call returns).

def _gpu_backends() -> dict[str, Backend]:
    from minipaged_cli.dataplane.cuda import CudaBackend, cuda_backend_unavailable_reason

    if not torch.cuda.is_available():
        skip_unless_required("torch sees no GPU", REQUIRE_GPU)
    backends: dict[str, Backend] = {"torch": TorchBackend("cuda")}
    if cuda_backend_unavailable_reason() is None:
        backends["cuda"] = CudaBackend()
    return backends


@pytest.mark.gpu
@pytest.mark.parametrize("layout", LAYOUTS)
def test_gpu_store_waits_for_the_step_and_load_finishes_before_attention(layout: str) -> None:
    for name, backend in _gpu_backends().items():
        cache = filled_cache(torch.bfloat16, 128, device="cuda", seed=4)
        pool = HostKVPool(cache, backend, num_slots=8, layout=layout)
        assert pool.host.is_pinned() if layout == "contiguous" else pool.host_layers[0][0].is_pinned()
        new = torch.randn(NUM_LAYERS, 2, NUM_KV_HEADS, BLOCK_SIZE, 128, device="cuda").to(torch.bfloat16)
        torch.cuda._sleep(200_000_000)  # the "step" that writes block 5 runs late on the compute stream
        for layer in range(NUM_LAYERS):
            cache.key_cache[layer][5].copy_(new[layer, 0])
            cache.value_cache[layer][5].copy_(new[layer, 1])
        pool.store([("x", 5)])  # must copy the step's K/V, not what block 5 held before
        for tensor in (*cache.key_cache, *cache.value_cache):
            tensor[5].fill_(0)  # block 5 reused by the next step, right away
        assert torch.equal(pool.host_block("x"), new.cpu()), name
        with torch.cuda.stream(pool.stream):
            torch.cuda._sleep(200_000_000)  # the link is busy: the load's copies start late
        pool.load([("x", 9)])
        assert torch.equal(blocks_of(cache, [9])[0], new.cpu()), name  # read on the compute stream
        pool.synchronize()
        assert pool.link_seconds["store"] > 0 and pool.link_seconds["load"] > 0
