"""Cache write and decode paged attention: every implementation against the naive one and against PyTorch's
scaled_dot_product_attention on the same K/V stored contiguously."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from minipaged_cli.dataplane.backends import TorchBackend
from minipaged_cli.dataplane.kv_cache import PagedKVCache
from minipaged_cli.dataplane.native import native_attention_available, paged_attention_native
from minipaged_cli.dataplane.reference import (
    cache_write_naive,
    check_paged_attention,
    paged_attention_naive,
    paged_attention_online,
    paged_attention_vectorized,
)
from tests.conftest import REQUIRE_SHARED, skip_unless_required

NUM_KV_HEADS = 2
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def tolerance(dtype: torch.dtype) -> dict[str, float]:
    """Every implementation reads the same stored values and accumulates in fp32; they differ only in the order
    of fp32 sums. fp32: a few ulps of O(1) outputs, 2e-5. fp16/bf16: the fp32 results differ by ~1e-6, but the
    final rounding to the output dtype can land them one ulp apart: eps(dtype) relative, and absolute for
    values near 0."""
    if dtype == torch.float32:
        return {"rtol": 2e-5, "atol": 2e-5}
    eps = torch.finfo(dtype).eps
    return {"rtol": eps, "atol": eps}


def make_batch(block_size: int, head_dim: int, group: int, dtype: torch.dtype, repeated: bool, seed: int = 0,
               longest: int = 517):
    """Three sequences (1 token, a non-multiple of the block size, a long one) over a scrambled block pool.

    ``repeated``: block ids drawn with replacement, so blocks repeat within and across tables (as with shared
    prefixes). Otherwise a random permutation, and every slot past a sequence's end holds NaN, as stale cache
    memory may.
    """
    generator = torch.Generator().manual_seed(seed)
    seq_lens = torch.tensor([1, 3 * block_size + block_size // 2 + 1, longest], dtype=torch.int32)
    needed = [-(-int(n) // block_size) for n in seq_lens]
    max_blocks = max(needed) + 2  # -1 padding beyond what any sequence reads
    num_blocks = sum(needed) + 3
    key_cache = torch.randn(num_blocks, NUM_KV_HEADS, block_size, head_dim, generator=generator).to(dtype)
    value_cache = torch.randn(num_blocks, NUM_KV_HEADS, block_size, head_dim, generator=generator).to(dtype)
    block_tables = torch.full((3, max_blocks), -1, dtype=torch.int32)
    if repeated:
        pool = max(2, num_blocks // 4)
        for row, n in enumerate(needed):
            block_tables[row, :n] = torch.randint(0, pool, (n,), generator=generator, dtype=torch.int32)
    else:
        order = torch.randperm(num_blocks, generator=generator).to(torch.int32)
        start = 0
        for row, (n, length) in enumerate(zip(needed, seq_lens.tolist(), strict=True)):
            block_tables[row, :n] = order[start:start + n]
            start += n
            last, used = int(block_tables[row, n - 1]), length - (n - 1) * block_size
            key_cache[last, :, used:] = float("nan")
            value_cache[last, :, used:] = float("nan")
        key_cache[order[start:]] = float("nan")  # blocks nobody reads
        value_cache[order[start:]] = float("nan")
    query = torch.randn(3, NUM_KV_HEADS * group, head_dim, generator=generator).to(dtype)
    return query, key_cache, value_cache, block_tables, seq_lens


def sdpa_reference(query, key_cache, value_cache, block_tables, seq_lens, scale) -> torch.Tensor:
    """PyTorch's attention, per sequence, on its K/V gathered contiguously and upcast to fp32."""
    block_size = key_cache.shape[2]
    group = query.shape[1] // key_cache.shape[1]
    outs = []
    for row, length in enumerate(seq_lens.tolist()):
        blocks = block_tables[row, : -(-length // block_size)].long()
        k = key_cache[blocks].float().permute(1, 0, 2, 3).reshape(key_cache.shape[1], -1, key_cache.shape[3])
        v = value_cache[blocks].float().permute(1, 0, 2, 3).reshape(key_cache.shape[1], -1, key_cache.shape[3])
        k, v = k[:, :length].repeat_interleave(group, 0), v[:, :length].repeat_interleave(group, 0)
        q = query[row].float()[:, None, :]  # [heads, 1, head_dim]
        outs.append(F.scaled_dot_product_attention(q, k, v, scale=scale)[:, 0])
    return torch.stack(outs)


@pytest.mark.native_build
@pytest.mark.slow
@pytest.mark.parametrize("repeated", [False, True], ids=["permuted", "repeated"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", [1, 8, 16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 2, 4, 8])
def test_attention_implementations_agree(group: int, head_dim: int, block_size: int, dtype: torch.dtype,
                                         repeated: bool) -> None:
    query, key_cache, value_cache, block_tables, seq_lens = make_batch(block_size, head_dim, group, dtype, repeated)
    scale = head_dim ** -0.5
    check_paged_attention(query, key_cache, value_cache, block_tables, seq_lens)
    naive = paged_attention_naive(query, key_cache, value_cache, block_tables, seq_lens, scale)
    assert not naive.isnan().any()
    reference = sdpa_reference(query, key_cache, value_cache, block_tables, seq_lens, scale)
    # The naive loop against PyTorch's SDPA in fp32: only the final rounding to dtype differs.
    torch.testing.assert_close(naive.float(), reference, **tolerance(dtype))
    candidates = {
        "vectorized": paged_attention_vectorized(query, key_cache, value_cache, block_tables, seq_lens, scale),
        "online": paged_attention_online(query, key_cache, value_cache, block_tables, seq_lens, scale),
        "online, 3 blocks a tile": paged_attention_online(query, key_cache, value_cache, block_tables, seq_lens,
                                                          scale, blocks_per_tile=3),
    }
    if native_attention_available():
        candidates["native"] = paged_attention_native(query, key_cache, value_cache, block_tables, seq_lens, scale)
    for name, out in candidates.items():
        assert out.dtype == dtype and out.shape == query.shape, name
        torch.testing.assert_close(out, naive, **tolerance(dtype), msg=lambda m, n=name: f"{n}: {m}")
        torch.testing.assert_close(out.float(), reference, **tolerance(dtype), msg=lambda m, n=name: f"{n}: {m}")


@pytest.mark.native_build
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_long_rows_take_the_tokens_down_path_and_agree(dtype: torch.dtype) -> None:
    # Above 2,048 tokens the vectorized version computes logits as x q^T; NaN fills every slot no one owns.
    query, key_cache, value_cache, block_tables, seq_lens = make_batch(16, 128, 4, dtype, repeated=False,
                                                                       longest=5003)
    scale = 128 ** -0.5
    reference = sdpa_reference(query, key_cache, value_cache, block_tables, seq_lens, scale)
    for attention in (paged_attention_vectorized, paged_attention_native):
        out = attention(query, key_cache, value_cache, block_tables, seq_lens, scale)
        assert not out.isnan().any()
        torch.testing.assert_close(out.float(), reference, **tolerance(dtype))


def test_a_single_token_returns_its_value() -> None:
    # softmax over one position is 1: the output is that token's V, whatever the query.
    query, key_cache, value_cache, block_tables, seq_lens = make_batch(4, 64, 2, torch.float32, repeated=False)
    out = paged_attention_vectorized(query, key_cache, value_cache, block_tables, seq_lens, 0.125)
    first_block = int(block_tables[0, 0])
    expected = value_cache[first_block, :, 0].repeat_interleave(2, 0)  # [num_q_heads, head_dim]
    torch.testing.assert_close(out[0], expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("block_size", [1, 8, 16])
def test_cache_write_is_bit_exact_from_strided_views(dtype: torch.dtype, block_size: int) -> None:
    generator = torch.Generator().manual_seed(1)
    num_tokens, num_q_heads, head_dim = 40, 8, 64
    num_blocks = -(-(num_tokens + 8) // block_size)  # a few slots to spare
    # A fused QKV projection output [tokens, q + 2 kv heads, head_dim]: K and V are strided views of it.
    qkv = torch.randn(num_tokens, num_q_heads + 2 * NUM_KV_HEADS, head_dim, generator=generator).to(dtype)
    key = qkv[:, num_q_heads:num_q_heads + NUM_KV_HEADS]
    value = qkv[:, num_q_heads + NUM_KV_HEADS:]
    assert not key.is_contiguous()
    slots = torch.randperm(num_blocks * block_size, generator=generator)[:num_tokens]
    slots[::7] = -1  # padding tokens: skipped
    slot_mapping = slots.to(torch.int64)
    caches = [PagedKVCache(1, num_blocks, NUM_KV_HEADS, block_size, head_dim, dtype) for _ in range(2)]
    for cache in caches:
        cache.key_cache[0].fill_(float("nan"))
        cache.value_cache[0].fill_(float("nan"))
    cache_write_naive(key, value, caches[0].key_cache[0], caches[0].value_cache[0], slot_mapping)
    TorchBackend().cache_write(key, value, caches[1].key_cache[0], caches[1].value_cache[0], slot_mapping)
    pairs = ((caches[0].key_cache[0], caches[1].key_cache[0]), (caches[0].value_cache[0], caches[1].value_cache[0]))
    for a, b in pairs:
        assert torch.equal(a.nan_to_num(7.0), b.nan_to_num(7.0))
    # each written token reads back from its slot; padding tokens were not written anywhere
    for token, slot in enumerate(slot_mapping.tolist()):
        if slot >= 0:
            assert torch.equal(caches[1].key_cache[0][slot // block_size, :, slot % block_size], key[token])
    written = int((slot_mapping >= 0).sum())
    assert int((~caches[1].key_cache[0].isnan()).all(dim=(1, 3)).sum()) == written


def test_cache_footprint() -> None:
    cache = PagedKVCache(num_layers=2, num_blocks=10, num_kv_heads=8, block_size=16, head_dim=128,
                         dtype=torch.bfloat16)
    assert cache.memory_bytes == 2 * 2 * 10 * 8 * 16 * 128 * 2
    assert cache.bytes_per_token == 2 * 2 * 8 * 128 * 2
    assert cache.num_slots == 160


BAD_ATTENTION = [
    ("seq_lens", lambda a: {**a, "seq_lens": torch.tensor([-1], dtype=torch.int32)}, ">= 0"),
    ("too long", lambda a: {**a, "seq_lens": torch.tensor([33], dtype=torch.int32)}, "exceeds max_blocks"),
    ("block id", lambda a: {**a, "block_tables": torch.tensor([[0, 99]], dtype=torch.int32)},
     r"block_tables\[0, 1\] = 99"),
    ("padding read", lambda a: {**a, "block_tables": torch.tensor([[3, -1]], dtype=torch.int32)},
     r"block_tables\[0, 1\] = -1"),
    ("dtype", lambda a: {**a, "block_tables": a["block_tables"].long()}, "int32"),
    ("gqa", lambda a: {**a, "query": torch.randn(1, 3, 64)}, "multiple"),
    ("query dtype", lambda a: {**a, "query": a["query"].half()}, "the cache is"),
    ("head_dim", lambda a: {**a, "query": torch.randn(1, 4, 32)}, "num_q_heads, 64"),
]


@pytest.mark.parametrize(("case", "change", "message"), BAD_ATTENTION, ids=[c[0] for c in BAD_ATTENTION])
def test_attention_validation(case: str, change, message: str) -> None:
    cache = PagedKVCache(1, 4, NUM_KV_HEADS, 16, 64, torch.float32)
    args = {"query": torch.randn(1, 4, 64), "block_tables": torch.tensor([[3, 1]], dtype=torch.int32),
            "seq_lens": torch.tensor([20], dtype=torch.int32)}
    args = change(args)
    with pytest.raises(ValueError, match=message):
        TorchBackend().paged_attention(args["query"], cache.key_cache[0], cache.value_cache[0],
                                       args["block_tables"], args["seq_lens"], 0.125)


@pytest.mark.parametrize(("slots", "message"), [([0, 64], r"holds 64"), ([-2, 0], r"holds -2")])
def test_cache_write_validation(slots: list[int], message: str) -> None:
    cache = PagedKVCache(1, 4, NUM_KV_HEADS, 16, 64, torch.float32)
    key = torch.randn(2, NUM_KV_HEADS, 64)
    with pytest.raises(ValueError, match=message):
        TorchBackend().cache_write(key, key, cache.key_cache[0], cache.value_cache[0], torch.tensor(slots))
    with pytest.raises(ValueError, match="int64"):
        TorchBackend().cache_write(key, key, cache.key_cache[0], cache.value_cache[0],
                                   torch.tensor([0, 1], dtype=torch.int32))
    with pytest.raises(ValueError, match="key must be"):
        TorchBackend().cache_write(key[:, :1], key, cache.key_cache[0], cache.value_cache[0], torch.tensor([0, 1]))


def test_validation_leaves_the_cache_untouched() -> None:
    cache = PagedKVCache(1, 4, NUM_KV_HEADS, 16, 64, torch.float32)
    cache.key_cache[0].zero_()
    key = torch.ones(2, NUM_KV_HEADS, 64)
    with pytest.raises(ValueError):
        TorchBackend().cache_write(key, key, cache.key_cache[0], cache.value_cache[0], torch.tensor([5, 64]))
    assert not cache.key_cache[0].any()  # the valid slot 5 was not written either


ATTENTION_PATHS = {
    "naive": paged_attention_naive,
    "vectorized": paged_attention_vectorized,
    "online": paged_attention_online,
    "torch backend": TorchBackend("cpu").paged_attention,  # the native kernel where it builds
    "torch backend, reference": TorchBackend("cpu", native=False).paged_attention,
    "native": paged_attention_native,
}


@pytest.mark.native_build
@pytest.mark.parametrize("path", sorted(ATTENTION_PATHS))
def test_an_empty_batch_and_sequences_of_length_0(path: str) -> None:
    if path == "native" and not native_attention_available():
        skip_unless_required("no C++ compiler for the native CPU attention", REQUIRE_SHARED)
    check_empty_batch_and_zero_lengths(ATTENTION_PATHS[path])


def check_empty_batch_and_zero_lengths(attention, dtype: torch.dtype = torch.float32) -> None:
    """What every attention path (the references here, the kernels in test_kernels.py) must do at the edges."""
    query, key_cache, value_cache, block_tables, seq_lens = make_batch(4, 64, 2, dtype, repeated=False)
    empty = attention(query[:0], key_cache, value_cache, block_tables[:0], seq_lens[:0], 0.125)
    assert empty.shape == (0, *query.shape[1:])
    # Lengths 0 among real ones (their block tables all padding, the cache NaN where nobody owns it): zeros
    # out, no NaN, and the other sequences unchanged.
    lens = torch.tensor([0, int(seq_lens[1]), 0], dtype=torch.int32)
    tables = block_tables.clone()
    tables[0], tables[2] = -1, -1
    out = attention(query, key_cache, value_cache, tables, lens, 0.125)
    assert not out.isnan().any()
    assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.equal(out[2], torch.zeros_like(out[2]))
    expected = sdpa_reference(query[1:2], key_cache, value_cache, tables[1:2], lens[1:2], 0.125)
    torch.testing.assert_close(out[1:2].float(), expected, **tolerance(dtype))
    all_zero = attention(query, key_cache, value_cache, tables[:, :0], torch.zeros(3, dtype=torch.int32), 0.125)
    assert torch.equal(all_zero, torch.zeros_like(query))
