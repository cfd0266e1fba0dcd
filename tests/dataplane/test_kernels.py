"""The CUDA kernels of cuda/: they compile with nvcc for sm_80 and sm_90, and the same source, compiled for the
CPU against cuda/emulation/cuda_emu.h, matches the Python references (tests/dataplane/test_paged_ops.py's batches:
scrambled or repeated block ids, NaN in every slot no sequence owns) — so indexing bugs are caught on every commit."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import torch

from minipaged_cli.dataplane import kernels
from minipaged_cli.dataplane.emulation import EmulatedBackend
from minipaged_cli.dataplane.kernels import random_block_tables
from minipaged_cli.dataplane.kv_cache import PagedKVCache
from minipaged_cli.dataplane.reference import cache_write_naive, paged_attention_naive, paged_attention_vectorized
from tests.conftest import REQUIRE_GPU, REQUIRE_SHARED, skip_unless_required
from tests.dataplane.test_paged_ops import (
    NUM_KV_HEADS,
    check_empty_batch_and_zero_lengths,
    make_batch,
    sdpa_reference,
    tolerance,
)

pytestmark = [pytest.mark.native_build, pytest.mark.slow]


@pytest.mark.parametrize("source", ["cache_write.cu", "paged_attention.cu", "paged_attention_tc.cu", "copy_blocks.cu",
                                    "mla_decode.cu"])
def test_kernels_compile_with_nvcc(source: str, tmp_path) -> None:
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        skip_unless_required("nvcc is not installed", REQUIRE_SHARED)
    # Both architectures in one call, compiled side by side (--threads): a CI core would otherwise sit idle.
    archs = [option for arch in ("80", "90") for option in ("-gencode", f"arch=compute_{arch},code=sm_{arch}")]
    result = subprocess.run([nvcc, *archs, "--threads", "2", "-fatbin", "-O3", "-o", str(tmp_path / "out.fatbin"),
                             str(kernels.CUDA_DIR / source)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "warning" not in result.stderr.lower(), result.stderr


@pytest.fixture(scope="module")
def emulated() -> EmulatedBackend:
    return EmulatedBackend()


@pytest.mark.parametrize("repeated", [False, True], ids=["permuted", "repeated"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("block_size", [1, 8, 16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("group", [1, 2, 4, 8])
def test_emulated_attention_matches_the_references(emulated: EmulatedBackend, group: int, head_dim: int,
                                                   block_size: int, dtype: torch.dtype, repeated: bool) -> None:
    query, key_cache, value_cache, block_tables, seq_lens = make_batch(block_size, head_dim, group, dtype, repeated)
    scale = head_dim ** -0.5
    out = emulated.paged_attention(query, key_cache, value_cache, block_tables, seq_lens, scale)
    assert not out.isnan().any()
    # The naive reference is a Python loop over tokens (0.5-4 s a case): it runs on the 24 cases of block size 8,
    # the vectorized one (tested against it in test_paged_ops.py) on all 192.
    reference = paged_attention_naive if block_size == 8 else paged_attention_vectorized
    torch.testing.assert_close(out, reference(query, key_cache, value_cache, block_tables, seq_lens, scale),
                               **tolerance(dtype))
    torch.testing.assert_close(out.float(), sdpa_reference(query, key_cache, value_cache, block_tables, seq_lens,
                                                           scale), **tolerance(dtype))


@pytest.mark.parametrize("variant", ["simple", "tensor-core"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("block_size", "head_dim", "group"), [(1, 64, 3), (64, 128, 8), (128, 64, 1), (128, 128, 5)])
def test_both_attention_kernels_on_large_blocks_with_splits(variant: str, dtype: torch.dtype, block_size: int,
                                                            head_dim: int, group: int) -> None:
    # Blocks of 64 and 128 tokens (a 16-token tile inside one block) and of 1 (a tile over 16 blocks), groups
    # that are not powers of two, each sequence in splits of 64 tokens merged by the merge kernel.
    backend = EmulatedBackend(tokens_per_split=64, attention_variant=variant)
    query, key_cache, value_cache, block_tables, seq_lens = make_batch(block_size, head_dim, group, dtype,
                                                                       repeated=False)
    out = backend.paged_attention(query, key_cache, value_cache, block_tables, seq_lens, head_dim ** -0.5)
    assert not out.isnan().any()
    torch.testing.assert_close(out.float(), sdpa_reference(query, key_cache, value_cache, block_tables, seq_lens,
                                                           head_dim ** -0.5), **tolerance(dtype))


@pytest.mark.parametrize("variant", ["simple", "tensor-core"])
def test_a_skewed_batch_and_lengths_0_and_1(variant: str) -> None:
    # One long sequence among short ones (2,000 tokens beside 1, 0, 17 and 33), split or not.
    generator = torch.Generator().manual_seed(3)
    lengths = [1, 2000, 0, 17, 33]
    num_blocks = sum(-(-n // 16) for n in lengths) + 4
    tables = random_block_tables(lengths, num_blocks, 16, generator)
    key_cache, value_cache = (torch.randn(num_blocks, 2, 16, 128, generator=generator).to(torch.bfloat16)
                              for _ in range(2))
    query = torch.randn(len(lengths), 8, 128, generator=generator).to(torch.bfloat16)
    seq_lens = torch.tensor(lengths, dtype=torch.int32)
    expected = paged_attention_naive(query, key_cache, value_cache, tables, seq_lens, 0.088)
    for tokens_per_split in (None, 256):
        out = EmulatedBackend(tokens_per_split=tokens_per_split, attention_variant=variant).paged_attention(
            query, key_cache, value_cache, tables, seq_lens, 0.088)
        assert torch.equal(out[2], torch.zeros_like(out[2]))  # length 0: zeros
        torch.testing.assert_close(out[0], value_cache[int(tables[0, 0]), :, 0].repeat_interleave(4, 0),
                                   rtol=0, atol=0)  # length 1: that token's V, exactly
        torch.testing.assert_close(out, expected, **tolerance(torch.bfloat16))


def test_the_tensor_core_kernel_at_the_edges() -> None:
    check_empty_batch_and_zero_lengths(EmulatedBackend(attention_variant="tensor-core").paged_attention,
                                       torch.bfloat16)
    with pytest.raises(ValueError, match="fp16 and bf16"):
        kernels.attention_kernel(torch.float32, 128, 4, "tensor-core")


@pytest.mark.parametrize("tokens_per_split", [32, 64, 10_000], ids=["32", "64", "one split"])
def test_split_k_merge_matches_one_pass(tokens_per_split: int) -> None:
    # 517 tokens in splits of 32 and 64 (a sequence of 1 token leaves most of its splits empty), and one split.
    backend = EmulatedBackend(tokens_per_split=tokens_per_split)
    query, key_cache, value_cache, block_tables, seq_lens = make_batch(16, 64, 4, torch.float32, repeated=False)
    out = backend.paged_attention(query, key_cache, value_cache, block_tables, seq_lens, 0.125)
    naive = paged_attention_naive(query, key_cache, value_cache, block_tables, seq_lens, 0.125)
    torch.testing.assert_close(out, naive, **tolerance(torch.float32))
    assert kernels.plan_splits(3, NUM_KV_HEADS, 517, 132, tokens_per_split)[1] == -(-517 // tokens_per_split)


@pytest.mark.parametrize("tokens_per_split", [None, 32], ids=["plan", "split 32"])
def test_emulated_attention_at_the_edges(tokens_per_split: int | None) -> None:
    # An empty batch launches nothing; a sequence of length 0 writes zeros (the kernel's sum is 0: not 0/0), with
    # or without split-K, whose merge sees no split at all for it.
    check_empty_batch_and_zero_lengths(EmulatedBackend(tokens_per_split=tokens_per_split).paged_attention)
    assert kernels.plan_splits(3, NUM_KV_HEADS, 0, 132) == (kernels.SPLIT_GRANULE, 1)


def test_split_plan() -> None:
    # Enough (sequence, kv head) blocks to fill 132 SMs twice: no split. Few, long: split, >= 256 tokens each.
    assert kernels.plan_splits(64, 8, 4096, 132) == (4096, 1)
    tokens_per_split, splits = kernels.plan_splits(1, 8, 4096, 132)
    assert splits == 16 and tokens_per_split == 256
    assert kernels.plan_splits(1, 8, 200, 132) == (224, 1)  # short: one split (rounded up to whole tiles)
    # Skewed: 32 sequences fill the GPU, but one of 32,768 tokens among 2,048s would run 16x longer than the
    # rest; splits of the mean length (3,008 tokens) cap every block's work.
    lengths = [32768] + [2048] * 31
    tokens_per_split, splits = kernels.plan_splits(32, 8, 32768, 132, total_tokens=sum(lengths))
    assert tokens_per_split == 3008 and splits == 11
    assert max(min(n, tokens_per_split) for n in lengths) <= 2 * sum(lengths) / len(lengths)
    # Uniform and enough blocks: no split (the longest is the mean).
    assert kernels.plan_splits(64, 8, 4096, 132, total_tokens=64 * 4096) == (4096, 1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("head_dim", [4, 64, 128])  # 4: rows too short for 16-byte vectors
def test_emulated_cache_write_is_bit_exact(emulated: EmulatedBackend, dtype: torch.dtype, head_dim: int) -> None:
    generator = torch.Generator().manual_seed(3)
    num_tokens, num_q_heads, block_size = 37, 4, 8
    qkv = torch.randn(num_tokens, num_q_heads + 2 * NUM_KV_HEADS, head_dim, generator=generator).to(dtype)
    key, value = qkv[:, num_q_heads:num_q_heads + NUM_KV_HEADS], qkv[:, num_q_heads + NUM_KV_HEADS:]
    num_blocks = -(-(num_tokens + 5) // block_size)
    slot_mapping = torch.randperm(num_blocks * block_size, generator=generator)[:num_tokens].to(torch.int64)
    slot_mapping[::5] = -1
    caches = [PagedKVCache(1, num_blocks, NUM_KV_HEADS, block_size, head_dim, dtype) for _ in range(2)]
    for cache in caches:
        cache.key_cache[0].fill_(float("nan"))
        cache.value_cache[0].fill_(float("nan"))
    cache_write_naive(key, value, caches[0].key_cache[0], caches[0].value_cache[0], slot_mapping)
    emulated.cache_write(key, value, caches[1].key_cache[0], caches[1].value_cache[0], slot_mapping)
    assert kernels.can_vectorize(key, value, caches[1].key_cache[0]) == (head_dim * key.element_size() % 16 == 0)
    bits = torch.int32 if dtype == torch.float32 else torch.int16  # compare bits: NaN != NaN as numbers
    for a, b in ((caches[0].key_cache[0], caches[1].key_cache[0]),
                 (caches[0].value_cache[0], caches[1].value_cache[0])):
        assert torch.equal(a.view(bits), b.view(bits))


def test_unsupported_shapes_are_refused(emulated: EmulatedBackend) -> None:
    query, key_cache, value_cache, block_tables, seq_lens = make_batch(16, 64, 2, torch.float32, repeated=False)
    with pytest.raises(ValueError, match="head_dim"):
        emulated.paged_attention(query[..., :32].contiguous(), key_cache[..., :32].contiguous(),
                                 value_cache[..., :32].contiguous(), block_tables, seq_lens, 0.1)


# -- on a GPU (pytest -m gpu; skipped elsewhere) ------------------------------------------------------------

def _cuda_backend():
    from minipaged_cli.dataplane.cuda import CudaBackend, cuda_backend_unavailable_reason

    reason = cuda_backend_unavailable_reason()
    if reason is not None:
        skip_unless_required(reason, REQUIRE_GPU)
    return CudaBackend()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("block_size", [8, 16, 32])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("heads", [(32, 8), (16, 8), (64, 8), (40, 40)], ids=str)
def test_gpu_attention_on_vllm_shapes(heads: tuple[int, int], head_dim: int, block_size: int,
                                      dtype: torch.dtype) -> None:
    # vLLM's test shapes: 7 sequences, random lengths up to 8,192 with one at the maximum, random block ids.
    backend = _cuda_backend()
    num_q_heads, num_kv_heads = heads
    generator = torch.Generator().manual_seed(0)
    seq_lens = torch.randint(1, 8193, (7,), generator=generator, dtype=torch.int32)
    seq_lens[-1] = 8192
    max_blocks = -(-8192 // block_size)
    num_blocks = 7 * max_blocks
    key_cache = torch.randn(num_blocks, num_kv_heads, block_size, head_dim, generator=generator).to(dtype)
    value_cache = torch.randn(num_blocks, num_kv_heads, block_size, head_dim, generator=generator).to(dtype)
    block_tables = torch.randint(0, num_blocks, (7, max_blocks), generator=generator, dtype=torch.int32)
    query = torch.randn(7, num_q_heads, head_dim, generator=generator).to(dtype)
    scale = head_dim ** -0.5
    # the naive reference over 8k tokens is slow in Python: the vectorized one is tested against it elsewhere
    reference = paged_attention_vectorized(query, key_cache, value_cache, block_tables, seq_lens, scale)
    device = backend.device
    out = backend.paged_attention(query.to(device), key_cache.to(device), value_cache.to(device),
                                  block_tables.to(device), seq_lens.to(device), scale)
    torch.testing.assert_close(out.cpu(), reference, **tolerance(dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("heads", [(32, 8), (64, 8)], ids=str)
def test_gpu_simple_kernel_where_tensor_cores_are_the_default(heads: tuple[int, int], dtype: torch.dtype) -> None:
    # The test above runs what the launcher picks (the tensor-core kernel for these dtypes); the simple one stays
    # selectable and correct.
    backend = _cuda_backend()
    generator = torch.Generator().manual_seed(1)
    num_q_heads, num_kv_heads = heads
    seq_lens = torch.tensor([1, 300, 4097, 0], dtype=torch.int32)
    tables = random_block_tables([max(1, n) for n in seq_lens.tolist()], 400, 16, generator)
    key_cache, value_cache = (torch.randn(400, num_kv_heads, 16, 128, generator=generator).to(dtype) for _ in range(2))
    query = torch.randn(4, num_q_heads, 128, generator=generator).to(dtype)
    reference = paged_attention_vectorized(query, key_cache, value_cache, tables, seq_lens, 0.088)
    device = backend.device
    for variant in ("simple", "tensor-core"):
        backend.attention_variant = variant
        out = backend.paged_attention(query.to(device), key_cache.to(device), value_cache.to(device),
                                      tables.to(device), seq_lens.to(device), 0.088)
        torch.testing.assert_close(out.cpu(), reference, **tolerance(dtype), msg=lambda m, v=variant: f"{v}: {m}")
    backend.attention_variant = "auto"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16], ids=str)
@pytest.mark.parametrize("tokens_per_split", [None, 64], ids=["plan", "split 64"])
def test_gpu_tensor_core_kernel_on_small_batches(tokens_per_split: int | None, dtype: torch.dtype) -> None:
    # Small enough for compute-sanitizer's racecheck, synccheck and initcheck (gpu_session.sh): 3 sequences up to
    # 517 tokens with NaN in every slot nobody owns, one split or splits of 64 merged.
    backend = _cuda_backend()
    backend.tokens_per_split, backend.attention_variant = tokens_per_split, "tensor-core"
    query, key_cache, value_cache, block_tables, seq_lens = make_batch(16, 128, 4, dtype, repeated=False)
    reference = paged_attention_vectorized(query, key_cache, value_cache, block_tables, seq_lens, 0.088)
    device = backend.device
    out = backend.paged_attention(query.to(device), key_cache.to(device), value_cache.to(device),
                                  block_tables.to(device), seq_lens.to(device), 0.088)
    torch.testing.assert_close(out.cpu(), reference, **tolerance(dtype))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_gpu_cache_write_is_bit_exact(dtype: torch.dtype) -> None:
    backend = _cuda_backend()
    generator = torch.Generator().manual_seed(1)
    qkv = torch.randn(500, 48, 128, generator=generator).to(dtype)
    key, value = qkv[:, 32:40], qkv[:, 40:]
    slot_mapping = torch.randperm(64 * 16, generator=generator)[:500].to(torch.int64)
    slot_mapping[::9] = -1
    expected = [torch.zeros(64, 8, 16, 128, dtype=dtype) for _ in range(2)]
    cache_write_naive(key, value, expected[0], expected[1], slot_mapping)
    device = backend.device
    caches = [torch.zeros(64, 8, 16, 128, dtype=dtype, device=device) for _ in range(2)]
    backend.cache_write(key.to(device), value.to(device), caches[0], caches[1], slot_mapping.to(device))
    assert torch.equal(caches[0].cpu(), expected[0]) and torch.equal(caches[1].cpu(), expected[1])


def copy_blocks_case(dtype: torch.dtype, head_dim: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(3)
    caches = [torch.randn(12, 2, 4, head_dim, generator=generator).to(dtype) for _ in range(2)]
    mapping = torch.tensor([[3, 7], [3, 0], [11, 5], [2, 9]], dtype=torch.int64)  # one src copied twice
    return caches[0], caches[1], mapping


def copied_by_hand(cache: torch.Tensor, mapping: torch.Tensor) -> torch.Tensor:
    expected = cache.clone()
    for src, dst in mapping.tolist():
        for index in range(cache[src].numel()):  # element by element: independent of any indexing helper
            expected[dst].view(-1)[index] = cache[src].reshape(-1)[index]
    return expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("head_dim", [3, 64])  # 3 x 2 bytes x 8 per block: not whole 16-byte vectors
def test_copy_blocks_reference_and_emulated_kernel_are_exact(emulated: EmulatedBackend, dtype: torch.dtype,
                                                             head_dim: int) -> None:
    from minipaged_cli.dataplane.backends import TorchBackend

    for backend in (TorchBackend(), emulated):
        key_cache, value_cache, mapping = copy_blocks_case(dtype, head_dim)
        expected_key, expected_value = copied_by_hand(key_cache, mapping), copied_by_hand(value_cache, mapping)
        backend.copy_blocks(key_cache, value_cache, mapping)
        assert torch.equal(key_cache, expected_key) and torch.equal(value_cache, expected_value), backend.name


def test_copy_blocks_refuses_racing_or_out_of_range_pairs(emulated: EmulatedBackend) -> None:
    key_cache, value_cache, _ = copy_blocks_case(torch.float32, 64)
    before = key_cache.clone()
    for mapping, message in (([[1, 12]], "outside"), ([[1, 2], [3, 2]], "twice"), ([[1, 2], [2, 3]], "reads")):
        with pytest.raises(ValueError, match=message):
            emulated.copy_blocks(key_cache, value_cache, torch.tensor(mapping, dtype=torch.int64))
    with pytest.raises(ValueError, match="int64"):
        emulated.copy_blocks(key_cache, value_cache, torch.tensor([[1, 2]], dtype=torch.int32))
    assert torch.equal(key_cache, before)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_gpu_copy_blocks_is_exact(dtype: torch.dtype) -> None:
    backend = _cuda_backend()
    key_cache, value_cache, mapping = copy_blocks_case(dtype, 128)
    expected = copied_by_hand(key_cache, mapping), copied_by_hand(value_cache, mapping)
    device = backend.device
    caches = key_cache.to(device), value_cache.to(device)
    backend.copy_blocks(*caches, mapping.to(device))
    assert torch.equal(caches[0].cpu(), expected[0]) and torch.equal(caches[1].cpu(), expected[1])


def test_commands_run_on_the_emulated_kernels(tmp_path) -> None:
    import json

    from typer.testing import CliRunner

    from minipaged_cli.cli.main import app

    runner = CliRunner()
    trace = tmp_path / "small.yaml"
    trace.write_text("requests:\n  - {id: a, arrival_s: 0, prompt_tokens: 40, output_tokens: 4}\n"
                     "  - {id: b, arrival_s: 0, prompt_tokens: 9, output_tokens: 6}\n")
    result = runner.invoke(app, ["run", str(trace), "--device", "emulated", "--kv-memory", "1GiB", "--num-layers", "1",
                                 "--json", "-"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["backend"] == "emulated"
    result = runner.invoke(app, ["verify", "--device", "emulated", "--model-config", "qwen3-gqa3-hd64", "--seq-lens",
                                 "9,4", "--decode-steps", "1", "--generate", "1", "--json", "-"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["backend"] == "emulated" and document["passed"]


def cu_signature(source: str, prefix: str) -> str:
    """The parameter types of the first ``extern "C"`` kernel whose name starts with ``prefix`` in ``cuda/source``,
    as PyCUDA spells them (P pointer, q int64_t, f float, i int), read from the .cu text itself."""
    text = re.sub(r"//[^\n]*", "", (kernels.CUDA_DIR / source).read_text()).replace("\\\n", " ")
    start = text.index(f'extern "C" __global__ void {prefix}')
    params = text[text.index("(", start) + 1:text.index(")", start)].split(",")
    kinds = {"int64_t": "q", "float": "f", "int": "i"}
    return "".join("P" if "*" in param else kinds[param.split()[-2]] for param in params)


def test_launch_argument_lists_match_the_kernels_signatures() -> None:
    # Both kernel backends pass these lists; PyCUDA prepares its calls from their types (argument_types). They
    # must match the parameters each .cu declares, in order.
    query, key_cache, value_cache, block_tables, seq_lens = make_batch(16, 64, 2, torch.float32, repeated=False)
    plan = kernels.plan_attention(query, NUM_KV_HEADS, 517, 132)
    assert plan.num_splits > 1
    key = torch.zeros(3, NUM_KV_HEADS, 64)
    cases = [
        (kernels.attention_args(plan, query, key_cache, value_cache, block_tables, seq_lens, 0.1),
         "paged_attention.cu", "paged_attention_##SUFFIX##_hd##HEAD_DIM##_g##MAX_G"),
        (kernels.merge_args(plan, seq_lens), "paged_attention.cu", "paged_attention_merge_"),
        (kernels.cache_write_args(key, key, key_cache, value_cache, torch.zeros(3, dtype=torch.int64), True),
         "cache_write.cu", "cache_write_"),
        (kernels.copy_blocks_args(key_cache, value_cache, torch.zeros(1, 2, dtype=torch.int64)), "copy_blocks.cu",
         "copy_blocks"),
    ]
    for args, source, name in cases:
        assert kernels.argument_types(args) == cu_signature(source, name), name


# -- launch rules, checked before every launch (kernels.py); on the CPU through the emulated backend ------------

def misaligned(tensor: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of ``tensor`` whose data starts one element past a 16-byte boundary."""
    buffer = torch.empty(tensor.numel() + 1, dtype=tensor.dtype)
    view = buffer[1:].view(tensor.shape)
    view.copy_(tensor)
    assert view.is_contiguous() and view.data_ptr() % 16
    return view


def test_a_misaligned_query_is_read_from_an_aligned_copy_and_misaligned_caches_are_refused(
        emulated: EmulatedBackend) -> None:
    query, key_cache, value_cache, block_tables, seq_lens = make_batch(16, 128, 4, torch.bfloat16, repeated=False)
    expected = paged_attention_naive(query, key_cache, value_cache, block_tables, seq_lens, 0.1)
    out = emulated.paged_attention(misaligned(query), key_cache, value_cache, block_tables, seq_lens, 0.1)
    torch.testing.assert_close(out, expected, **tolerance(torch.bfloat16))
    with pytest.raises(ValueError, match="16-byte boundary"):
        emulated.paged_attention(query, misaligned(key_cache), value_cache, block_tables, seq_lens, 0.1)


def test_misaligned_caches_take_the_scalar_paths(emulated: EmulatedBackend) -> None:
    key_cache, value_cache, mapping = copy_blocks_case(torch.bfloat16, 64)
    key_cache, value_cache = misaligned(key_cache), misaligned(value_cache)
    assert kernels.copy_blocks_args(key_cache, value_cache, mapping)[-1] == 0  # not vectorized
    expected = copied_by_hand(key_cache, mapping), copied_by_hand(value_cache, mapping)
    emulated.copy_blocks(key_cache, value_cache, mapping)
    assert torch.equal(key_cache, expected[0]) and torch.equal(value_cache, expected[1])
    key = torch.randn(5, NUM_KV_HEADS, 64).to(torch.bfloat16)
    slots = torch.tensor([0, 9, 17, 30, 47], dtype=torch.int64)
    assert not kernels.cache_write_operands(key, key, key_cache, value_cache)[2]
    reference = [key_cache.clone(), value_cache.clone()]
    cache_write_naive(key, key, reference[0], reference[1], slots)
    emulated.cache_write(key, key, key_cache, value_cache, slots)
    assert torch.equal(key_cache, reference[0]) and torch.equal(value_cache, reference[1])


def test_a_batch_beyond_the_grid_limit_is_refused_before_launch() -> None:
    query = torch.zeros(kernels.MAX_GRID_YZ + 1, 1, 64)
    with pytest.raises(ValueError, match="grid's limit"):
        kernels.plan_attention(query, 1, 100, 132)
    kernels.plan_attention(query[: kernels.MAX_GRID_YZ], 1, 100, 132)  # at the limit: fine


def test_split_scratch_is_float32_whatever_the_default_dtype(emulated: EmulatedBackend) -> None:
    query, key_cache, value_cache, block_tables, seq_lens = make_batch(16, 64, 2, torch.float32, repeated=False)
    expected = paged_attention_naive(query, key_cache, value_cache, block_tables, seq_lens, 0.125)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        plan = kernels.plan_attention(query, NUM_KV_HEADS, 517, 132, tokens_per_split=64)
        assert {plan.tmp_out.dtype, plan.tmp_max.dtype, plan.tmp_sum.dtype} == {torch.float32}
        out = EmulatedBackend(tokens_per_split=64).paged_attention(query, key_cache, value_cache, block_tables,
                                                                   seq_lens, 0.125)
    finally:
        torch.set_default_dtype(default)
    torch.testing.assert_close(out, expected, **tolerance(torch.float32))


def test_a_cache_write_with_a_slot_twice_is_refused(emulated: EmulatedBackend) -> None:
    cache = PagedKVCache(1, 4, NUM_KV_HEADS, 4, 64, torch.float32)
    cache.key_cache[0].zero_()
    key = torch.randn(3, NUM_KV_HEADS, 64)
    before = cache.key_cache[0].clone()
    with pytest.raises(ValueError, match="slot 5 more than once"):
        emulated.cache_write(key, key, cache.key_cache[0], cache.value_cache[0],
                             torch.tensor([5, -1, 5], dtype=torch.int64))
    assert torch.equal(cache.key_cache[0], before)
    emulated.cache_write(key, key, cache.key_cache[0], cache.value_cache[0],
                         torch.tensor([-1, 5, -1], dtype=torch.int64))  # padding may repeat


@pytest.mark.gpu
def test_gpu_kernels_run_in_order_with_work_on_torchs_current_stream() -> None:
    # On a side stream: a GPU-side delay, then torch fills the caches (queued, not done), then the kernel is
    # launched without any host synchronisation (launch_attention: the checked path reads device values back, which
    # would wait for the fill), then torch reads the output on the same stream. Without ordering the kernel would
    # run at once on the caches' zeros.
    backend = _cuda_backend()
    device = backend.device
    query, key_cache, value_cache, block_tables, seq_lens = make_batch(16, 128, 4, torch.bfloat16, repeated=False)
    expected = paged_attention_naive(query, key_cache, value_cache, block_tables, seq_lens, 0.1)
    sources = [key_cache.to(device), value_cache.to(device)]
    caches = [torch.zeros_like(source) for source in sources]
    query, block_tables, seq_lens = query.to(device), block_tables.to(device), seq_lens.to(device)
    torch.cuda.synchronize(device)
    side = torch.cuda.Stream(device)
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # about 0.1 s of GPU time before the fill
        for cache, source in zip(caches, sources, strict=True):
            cache.copy_(source)  # device to device: queued behind the delay
        out = backend.launch_attention(query, caches[0], caches[1], block_tables, seq_lens, 0.1, 517)
        result = (out * 1).cpu()  # torch reads the output on the side stream
    torch.testing.assert_close(result, expected, **tolerance(torch.bfloat16))
