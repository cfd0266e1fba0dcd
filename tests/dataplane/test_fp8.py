"""The fp8 KV cache in every backend: the cache write quantizes bit for bit as torch's own float8 casts (round to
nearest even) with CUDA's saturation, every backend reads all 256 bit patterns back exactly, and attention over
fp8 caches matches the naive reference (same stored values, fp32 sums in another order)."""

from __future__ import annotations

import pytest
import torch

from minipaged_cli.dataplane.backends import TorchBackend
from minipaged_cli.dataplane.emulation import EmulatedBackend
from minipaged_cli.dataplane.fp8 import amax_scale, quantize
from minipaged_cli.dataplane.kernels import unsupported_reason
from minipaged_cli.dataplane.kv_cache import PagedKVCache
from minipaged_cli.dataplane.native import native_attention_available
from minipaged_cli.dataplane.reference import (
    paged_attention_naive,
    paged_attention_online,
    paged_attention_vectorized,
)
from tests.dataplane.test_paged_ops import NUM_KV_HEADS, make_batch, tolerance

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
LARGEST = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}  # the formats' largest finite values


@pytest.fixture(scope="module")
def emulated() -> EmulatedBackend:
    return EmulatedBackend()


def torch_cast(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The independent reference: x / scale in fp32, clamped to the largest finite value (CUDA's __NV_SATFINITE:
    infinities too; NaN passes through clamp), then torch's own float8 cast (round to nearest even)."""
    return (x.float() / scale[None, :, None]).clamp(-LARGEST[dtype], LARGEST[dtype]).to(dtype)


def hard_values(dtype: torch.dtype) -> torch.Tensor:
    """Values at every edge of the format: its largest, the rounding ties around it and above it (saturated),
    infinities, NaN, the subnormals and the ties below them, signed zeros, and every representable value."""
    largest = LARGEST[dtype]
    spacing_at_top = {torch.float8_e4m3fn: 32.0, torch.float8_e5m2: 8192.0}[dtype]
    smallest = float(torch.finfo(dtype).smallest_normal) * float(torch.finfo(dtype).eps)  # smallest subnormal
    every = torch.arange(256, dtype=torch.uint8).view(dtype).float()
    every = every[torch.isfinite(every)]
    midpoints = (every.sort().values[1:] + every.sort().values[:-1]) / 2  # ties: round to the even neighbour
    edges = torch.tensor([largest, largest + spacing_at_top / 2, largest + spacing_at_top, 1e30, float("inf"),
                          -float("inf"), float("nan"), smallest, smallest / 2, smallest * 0.75, smallest * 1.5,
                          0.0, -0.0])
    return torch.cat([every, midpoints, edges, -edges])


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_hand_worked_conversions(dtype: torch.dtype) -> None:
    # Worked by hand from the formats (e4m3: 3 mantissa bits, bias 7, S.1111.111 = NaN; e5m2: 2 bits, bias 15).
    stored = quantize(torch.tensor([[[464.0, 500.0, float("inf"), 3 * 2.0 ** -11, 2.0 ** -10, 1.0625, 1.1875]]]),
                      torch.ones(1), dtype).float().flatten().tolist()
    if dtype == torch.float8_e4m3fn:
        # 464 is the tie between 448 (mantissa 110) and 480 (not finite): saturates to 448, as do 500 and inf;
        # 1.5 x 2^-10 is 0.75 of the smallest subnormal 2^-9: rounds up to it; 2^-10 is the tie with 0: even, 0;
        # 1.0625 = 1 + 2^-4 is the tie between 1 and 1.125: even, 1; 1.1875 the tie 1.125 / 1.25: even, 1.25.
        assert stored == [448.0, 448.0, 448.0, 2.0 ** -9, 0.0, 1.0, 1.25]
    else:
        # e5m2 (spacing 64 between 256 and 512, finite values up to 57344): 464 and 500 round to 448 and 512;
        # inf saturates; 1.5 x 2^-10 and 2^-10 are normal (e5m2's smallest normal is 2^-14) and exact; 1.0625
        # lies nearer 1 than 1.25, 1.1875 nearer 1.25 (e5m2 has 1, 1.25, 1.5, 1.75 in [1, 2)).
        assert stored == [448.0, 512.0, 57344.0, 3 * 2.0 ** -11, 2.0 ** -10, 1.0, 1.25]


@pytest.mark.native_build
@pytest.mark.parametrize("query_dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_every_backend_writes_what_torchs_cast_stores(emulated: EmulatedBackend, dtype: torch.dtype,
                                                      query_dtype: torch.dtype) -> None:
    values = hard_values(dtype)
    num_tokens = -(-len(values) // (NUM_KV_HEADS * 64))
    padded = torch.cat([values, torch.ones(num_tokens * NUM_KV_HEADS * 64 - len(values))])
    key = padded.view(num_tokens, NUM_KV_HEADS, 64).to(query_dtype)
    value = -key
    k_scale = torch.tensor([1.0, 0.375])  # per kv head; 0.375 is not a power of two: the division rounds
    v_scale = torch.tensor([2.0, 2.0])
    slot_mapping = torch.randperm(8 * num_tokens, generator=torch.Generator().manual_seed(0))[:num_tokens]
    expected_key, expected_value = torch_cast(key, k_scale, dtype), torch_cast(value, v_scale, dtype)
    for backend in (TorchBackend(), emulated):
        caches = [torch.zeros(8 * num_tokens, NUM_KV_HEADS, 1, 64, dtype=dtype) for _ in range(2)]
        backend.cache_write(key, value, caches[0], caches[1], slot_mapping, k_scale, v_scale)
        for cache, expected in zip(caches, (expected_key, expected_value), strict=True):
            stored = cache[slot_mapping, :, 0]  # [num_tokens, NUM_KV_HEADS, 64]
            nan = expected.float().isnan()
            assert torch.equal(stored.float().isnan(), nan), backend.name
            assert torch.equal(stored.view(torch.uint8)[~nan], expected.view(torch.uint8)[~nan]), backend.name


def one_token_backends(emulated: EmulatedBackend, query_dtype: torch.dtype) -> list:
    backends = [("vectorized", lambda *a: paged_attention_vectorized(*a[:6], k_scale=a[6], v_scale=a[7])),
                ("naive", lambda *a: paged_attention_naive(*a[:6], k_scale=a[6], v_scale=a[7])),
                ("online", lambda *a: paged_attention_online(*a[:6], k_scale=a[6], v_scale=a[7])),
                ("emulated simple", EmulatedBackend(attention_variant="simple", library=emulated.library)
                 .paged_attention)]
    if native_attention_available():
        backends.append(("native", TorchBackend().paged_attention))
    if query_dtype != torch.float32:
        backends.append(("emulated tensor-core", EmulatedBackend(attention_variant="tensor-core",
                                                                 library=emulated.library).paged_attention))
    return backends


@pytest.mark.native_build
@pytest.mark.parametrize("query_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_every_backend_reads_all_256_bit_patterns_back(emulated: EmulatedBackend, dtype: torch.dtype,
                                                       query_dtype: torch.dtype) -> None:
    # One token: its softmax weight is exactly 1, so the output is its V times v_scale, exactly (in the query's
    # dtype). The token's 2 x 128 V elements are the 256 bit patterns: every decode path meets every one, NaN
    # patterns included (a NaN stored for a valid token reaches the output, as in a 16-bit cache).
    bits = torch.arange(256, dtype=torch.uint8)
    value_cache = bits.view(dtype).view(1, 2, 1, 128).clone()
    key_cache = torch.zeros(1, 2, 1, 128, dtype=dtype)
    k_scale, v_scale = torch.tensor([1.0, 1.0]), torch.tensor([0.5, 3.0])
    query = torch.randn(1, 4, 128, generator=torch.Generator().manual_seed(1)).to(query_dtype)
    tables, lengths = torch.zeros(1, 1, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    decoded = bits.view(dtype).float().view(2, 128)  # torch's own widening: the independent reference
    expected = (decoded * v_scale[:, None]).repeat_interleave(2, 0)[None].to(query_dtype)  # group 2
    for name, attend in one_token_backends(emulated, query_dtype):
        out = attend(query, key_cache, value_cache, tables, lengths, 0.1, k_scale, v_scale)
        assert torch.equal(out.isnan(), expected.isnan()), name
        assert torch.equal(out[~out.isnan()], expected[~expected.isnan()]), name


def fp8_batch(dtype: torch.dtype, query_dtype: torch.dtype, block_size: int, head_dim: int, group: int,
              per_head: bool) -> tuple:
    """make_batch's scrambled batch (NaN in every slot no sequence owns) with its caches quantized to fp8 by
    amax scales, K scaled up so that the scales are not 1."""
    query, key_cache, value_cache, block_tables, seq_lens = make_batch(block_size, head_dim, group, torch.float32,
                                                                       repeated=False, longest=150)
    key_cache = key_cache * torch.tensor([30.0, 0.2])[None, :, None, None]  # the two kv heads far apart

    def to_fp8(cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = cache.transpose(1, 2).reshape(-1, NUM_KV_HEADS, head_dim)  # [slots, kv heads, head_dim]
        scale = amax_scale(rows, dtype, per_head)
        stored = quantize(rows, scale, dtype).view(cache.shape[0], block_size, NUM_KV_HEADS, head_dim)
        return stored.transpose(1, 2).contiguous(), scale

    (key_fp8, k_scale), (value_fp8, v_scale) = to_fp8(key_cache), to_fp8(value_cache)
    return query.to(query_dtype), key_fp8, value_fp8, block_tables, seq_lens, k_scale, v_scale


# Each fp8 format with each query dtype once, per-tensor and per-head scales, three shapes (blocks of 16, 8 and 1;
# head_dim 128 and 64; GQA groups 4, 3 and 8): six cases, seconds each under the emulation.
E4M3, E5M2 = FP8
CASES = [(E4M3, torch.float32, False, 16, 128, 4), (E4M3, torch.bfloat16, True, 8, 64, 3),
         (E4M3, torch.float16, False, 1, 128, 8), (E5M2, torch.bfloat16, False, 16, 128, 4),
         (E5M2, torch.float32, True, 1, 128, 8), (E5M2, torch.float16, True, 8, 64, 3)]


@pytest.mark.native_build
@pytest.mark.slow
@pytest.mark.parametrize(("dtype", "query_dtype", "per_head", "block_size", "head_dim", "group"), CASES, ids=str)
def test_attention_over_an_fp8_cache_matches_the_naive_reference(
        emulated: EmulatedBackend, dtype: torch.dtype, query_dtype: torch.dtype, per_head: bool, block_size: int,
        head_dim: int, group: int) -> None:
    # Every backend reads the same stored fp8 values and accumulates in fp32; the kernels fold the scales into
    # the query and the output where the reference multiplies each element (a different fp32 rounding, ~1 ulp),
    # so test_paged_ops' tolerance applies. The tensor-core kernel also rounds P to 16 bits: that tolerance is
    # one ulp of the output's dtype, as for its 16-bit caches.
    query, key_cache, value_cache, block_tables, seq_lens, k_scale, v_scale = fp8_batch(
        dtype, query_dtype, block_size, head_dim, group, per_head)
    scale = head_dim ** -0.5
    expected = paged_attention_naive(query, key_cache, value_cache, block_tables, seq_lens, scale, k_scale, v_scale)
    assert not expected.isnan().any()
    for name, attend in one_token_backends(emulated, query_dtype):
        out = attend(query, key_cache, value_cache, block_tables, seq_lens, scale, k_scale, v_scale)
        torch.testing.assert_close(out, expected, **tolerance(query_dtype), msg=name)
    split = EmulatedBackend(tokens_per_split=64, library=emulated.library)
    torch.testing.assert_close(split.paged_attention(query, key_cache, value_cache, block_tables, seq_lens, scale,
                                                     k_scale, v_scale), expected, **tolerance(query_dtype))


def test_the_cache_fixes_its_scales_at_the_first_write() -> None:
    cache = PagedKVCache(1, 4, 2, 4, 64, torch.float8_e4m3fn, scale_mode="head")
    key = torch.randn(3, 2, 64) * torch.tensor([10.0, 0.1])[None, :, None]
    key[0, 1, 5] = float("inf")  # left out of the amax
    k_scale, _ = cache.scales_for_write(0, key, key.abs())
    assert torch.allclose(k_scale, torch.stack([key[:, 0].abs().max(), key[:, 1][key[:, 1].isfinite()].abs().max()])
                          / 448)
    assert torch.equal(cache.scales_for_write(0, key * 100, key)[0], k_scale)  # fixed: later writes saturate
    assert PagedKVCache(1, 4, 2, 4, 64, torch.float8_e5m2, scale_mode="one").scales(0)[0].tolist() == [1.0, 1.0]
    assert PagedKVCache(1, 4, 2, 4, 64, torch.bfloat16).scales(0) == (None, None)
    assert PagedKVCache(1, 4, 2, 4, 64, torch.float8_e4m3fn).bytes_per_token == 2 * 2 * 64  # 1 byte an element


def test_scales_are_checked() -> None:
    key = torch.randn(2, 2, 64)
    caches = [torch.zeros(4, 2, 4, 64, dtype=torch.float8_e4m3fn) for _ in range(2)]
    slots = torch.tensor([0, 5])
    with pytest.raises(ValueError, match="needs k_scale float32 \\[2\\]"):
        TorchBackend().cache_write(key, key, caches[0], caches[1], slots)
    with pytest.raises(ValueError, match="finite and > 0"):
        TorchBackend().cache_write(key, key, caches[0], caches[1], slots, torch.tensor([1.0, 0.0]), torch.ones(2))
    bf16 = [torch.zeros(4, 2, 4, 64, dtype=torch.bfloat16) for _ in range(2)]
    with pytest.raises(ValueError, match="for fp8 caches"):
        TorchBackend().cache_write(key.bfloat16(), key.bfloat16(), bf16[0], bf16[1], slots, torch.ones(2),
                                   torch.ones(2))


def test_fp8_needs_hardware_conversion() -> None:
    # sm_89 (Ada) and sm_90 (Hopper) convert fp8 in hardware; an A100 (sm_80) is refused, naming its arch.
    assert unsupported_reason(128, 4, "fp8_e4m3", (9, 0)) is None
    assert unsupported_reason(128, 4, "fp8_e4m3", (8, 9)) is None
    assert unsupported_reason(128, 4, "auto", (8, 0)) is None
    reason = unsupported_reason(128, 4, "fp8_e5m2", (8, 0))
    assert reason is not None and "sm_89" in reason and "sm_80" in reason
    assert EmulatedBackend(capability=(8, 0)).unsupported(16, 4, 128, "fp8") is not None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_gpu_fp8_write_is_bit_exact_and_attention_matches(dtype: torch.dtype) -> None:
    # The hardware conversion (cvt.rn.satfinite on sm_89+) against torch's cast, every edge value; then both
    # attention kernels over a scrambled fp8 batch against the naive reference on the CPU.
    from tests.dataplane.test_kernels import _cuda_backend

    backend = _cuda_backend()
    device = backend.device
    values = hard_values(dtype)
    num_tokens = -(-len(values) // (NUM_KV_HEADS * 128))
    key = torch.cat([values, torch.ones(num_tokens * NUM_KV_HEADS * 128 - len(values))]).view(
        num_tokens, NUM_KV_HEADS, 128).to(torch.bfloat16)
    scales = torch.tensor([1.0, 0.375])
    caches = [torch.zeros(num_tokens, NUM_KV_HEADS, 1, 128, dtype=dtype, device=device) for _ in range(2)]
    backend.cache_write(key.to(device), key.to(device), caches[0], caches[1],
                        torch.arange(num_tokens, device=device), scales.to(device), scales.to(device))
    expected = torch_cast(key, scales, dtype)
    nan = expected.float().isnan()
    stored = caches[0].cpu()[:, :, 0]
    assert torch.equal(stored.float().isnan(), nan)
    assert torch.equal(stored.view(torch.uint8)[~nan], expected.view(torch.uint8)[~nan])

    batch = fp8_batch(dtype, torch.bfloat16, 16, 128, 4, per_head=True)
    reference = paged_attention_naive(*batch[:5], 128 ** -0.5, *batch[5:])
    for variant in ("simple", "tensor-core"):
        backend.attention_variant = variant
        out = backend.paged_attention(*(t.to(device) for t in batch[:5]), 128 ** -0.5,
                                      *(t.to(device) for t in batch[5:]))
        torch.testing.assert_close(out.cpu(), reference, **tolerance(torch.bfloat16), msg=variant)
