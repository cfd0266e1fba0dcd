"""What the CUDA kernels of ``cuda/`` need from their launchers, shared by the PyCUDA and the emulated backend:
entry-point names per dtype, what the kernels cover, the split-K plan, and the launch rules checked before every
launch (a wrong launch on a GPU can kill the process's CUDA context):

- 16-byte vector loads and stores only where every base pointer and row stride they touch is 16-byte aligned:
  cache_write and copy_blocks then take their scalar path, and attention (which has none) reads a copy of a
  misaligned query and refuses misaligned caches;
- no launch for an empty batch (grids cannot be empty), and no grid beyond CUDA's y/z limit of 65,535 (a batch
  that large is refused with a clear error);
- the split-K scratch buffers are float32, whatever torch's default dtype is.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

# An installed wheel carries cuda/ inside the package; a source checkout has it beside the package.
_PACKAGE_DIR = Path(__file__).resolve().parent.parent
CUDA_DIR = next((d for d in (_PACKAGE_DIR / "cuda", _PACKAGE_DIR.parent / "cuda") if d.is_dir()),
                _PACKAGE_DIR.parent / "cuda")
SUFFIX = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
FP8_SUFFIX = {torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}  # an fp8 cache's, after the query's
FP8_MIN_ARCH = (8, 9)  # sm_89 (Ada) and later convert fp8 in hardware (cvt.rn.satfinite.e4m3x2.f32 and back)
TENSOR_CORE_DTYPES = (torch.float16, torch.bfloat16)
HEAD_DIMS = (64, 128)
GROUP_SIZES = (1, 2, 4, 8)  # the MAX_G instantiations of cuda/paged_attention.cu
MAX_GROUP = GROUP_SIZES[-1]  # query heads per kv head in one thread block, at most
SPLIT_GRANULE = 32  # a split holds a multiple of this many tokens (whole blocks for block sizes up to 32)
NUM_THREADS = 128  # threads per attention block (NUM_THREADS, 32 * TC_WARPS in the .cu files)
CACHE_WRITE_THREADS = 128
COPY_BLOCKS_THREADS = 128
MIN_TOKENS_PER_SPLIT = 256
MAX_GRID_YZ = 65_535  # CUDA's limit on gridDim.y and gridDim.z


ATTENTION_VARIANTS = ("auto", "simple", "tensor-core")


def _suffix(dtype: torch.dtype, cache_dtype: torch.dtype | None) -> str:
    """The query's dtype, and the cache's when it is fp8: ``bf16``, ``bf16_e4m3``."""
    return SUFFIX[dtype] + (f"_{FP8_SUFFIX[cache_dtype]}" if cache_dtype in FP8_SUFFIX else "")


def attention_kernel(dtype: torch.dtype, head_dim: int, group: int, variant: str = "auto",
                     cache_dtype: torch.dtype | None = None) -> tuple[str, str]:
    """(source, kernel) of decode attention. ``tensor-core`` (``cuda/paged_attention_tc.cu``, fp16 and bf16: ``auto``
    picks it for them) or ``simple`` (``cuda/paged_attention.cu``, every dtype: the instantiation whose register
    state fits ``group`` query heads, the smallest MAX_G >= group). Both write the same split scratch, merged by
    the simple file's merge kernel. ``cache_dtype``: the caches' when they are fp8 (None: the query's)."""
    if variant not in ATTENTION_VARIANTS:
        raise ValueError(f"attention variant {variant!r}: expected one of {', '.join(ATTENTION_VARIANTS)}")
    if variant == "tensor-core" and dtype not in TENSOR_CORE_DTYPES:
        raise ValueError(f"the tensor-core kernel covers fp16 and bf16, not {dtype}")
    if variant == "tensor-core" or (variant == "auto" and dtype in TENSOR_CORE_DTYPES):
        return "paged_attention_tc", f"paged_attention_tc_{_suffix(dtype, cache_dtype)}_hd{head_dim}"
    max_g = next(g for g in GROUP_SIZES if g >= group)
    return "paged_attention", f"paged_attention_{_suffix(dtype, cache_dtype)}_hd{head_dim}_g{max_g}"


def merge_kernel(dtype: torch.dtype, head_dim: int) -> str:
    return f"paged_attention_merge_{SUFFIX[dtype]}_hd{head_dim}"


def cache_write_kernel(dtype: torch.dtype, cache_dtype: torch.dtype | None = None) -> str:
    return f"cache_write_{_suffix(dtype, cache_dtype)}"


def unsupported_reason(head_dim: int, group: int, kv_cache_dtype: str = "auto",
                       capability: tuple[int, int] | None = None) -> str | None:
    """Why the kernels cannot run that shape (they are compiled for head_dim 64 and 128, GQA groups up to 8) or
    that ``--kv-cache-dtype`` on a GPU of that compute ``capability`` (fp8 needs sm_89 or later)."""
    if kv_cache_dtype != "auto" and capability is not None and capability < FP8_MIN_ARCH:
        return (f"{{kv_cache_dtype={kv_cache_dtype}}} needs sm_{FP8_MIN_ARCH[0]}{FP8_MIN_ARCH[1]} or later (hardware "
                f"fp8 conversion); this GPU is sm_{capability[0]}{capability[1]}")
    if head_dim not in HEAD_DIMS:
        return f"the CUDA kernels cover head_dim {' and '.join(map(str, HEAD_DIMS))}, not {head_dim}"
    if group > MAX_GROUP:
        return f"the CUDA kernels cover up to {MAX_GROUP} query heads per kv head, not {group}"
    return None



def plan_splits(batch: int, num_kv_heads: int, max_seq_len: int, num_sms: int,
                tokens_per_split: int | None = None, total_tokens: int | None = None) -> tuple[int, int]:
    """(tokens_per_split, num_splits): the work of a thread block is a split's tokens. One split per (sequence,
    kv head) unless
    - those thread blocks cannot fill the GPU (fewer than two per SM) and the sequences are long: then about two
      blocks per SM, each at least MIN_TOKENS_PER_SPLIT tokens;
    - the batch is skewed (its longest sequence holds more than twice the mean, ``total_tokens / batch``):
      then splits of the mean length (at least MIN_TOKENS_PER_SPLIT), so that no block runs much longer than the
      others (the more splits of the two rules, when both apply). The grid holds as many splits for every
      sequence as the longest needs; a block past its sequence's end returns at once.
    """
    max_seq_len = max(max_seq_len, 1)  # a batch of empty sequences still launches one split (it writes zeros)
    if tokens_per_split is None:
        blocks = batch * num_kv_heads
        splits = 1
        mean = (total_tokens or 0) / batch if batch else 0
        if blocks < 2 * num_sms and max_seq_len > MIN_TOKENS_PER_SPLIT:
            splits = min(-(-2 * num_sms // blocks), -(-max_seq_len // MIN_TOKENS_PER_SPLIT))
        if total_tokens is not None and max_seq_len > 2 * mean and max_seq_len > MIN_TOKENS_PER_SPLIT:
            splits = max(splits, -(-max_seq_len // max(MIN_TOKENS_PER_SPLIT, int(mean))))
        tokens_per_split = -(-max_seq_len // splits)
    tokens_per_split = -(-tokens_per_split // SPLIT_GRANULE) * SPLIT_GRANULE
    return tokens_per_split, -(-max_seq_len // tokens_per_split)


def rows_contiguous(tensor: torch.Tensor) -> bool:
    """[tokens, heads, head_dim] with each token's heads back to back (any token stride): what cache_write reads."""
    return tensor.stride(2) == 1 and tensor.stride(1) == tensor.shape[2]


def can_vectorize(*tensors: torch.Tensor) -> bool:
    """16-byte loads and stores: every row starts on a 16-byte boundary and head_dim fills whole vectors (the
    base pointer, the row length and every stride but the last are multiples of 16 bytes)."""
    for tensor in tensors:
        size = tensor.element_size()
        if tensor.data_ptr() % 16 or (tensor.shape[-1] * size) % 16 or \
                any((stride * size) % 16 for stride in tensor.stride()[:-1]):
            return False
    return True


def attention_operands(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor) -> torch.Tensor:
    """The query as the attention kernel reads it: contiguous and 16-byte aligned (a copy when it is not). The
    kernel has no scalar path, so misaligned caches are refused."""
    query = query.contiguous()
    if not can_vectorize(query):
        query = query.clone()  # a fresh allocation: aligned
    if not can_vectorize(key_cache, value_cache):
        raise ValueError("the attention kernel reads 16-byte vectors: key_cache and value_cache must start on a "
                         "16-byte boundary (a whole tensor, not a view at an odd offset)")
    return query


def cache_write_operands(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                         value_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, bool]:
    """key and value as cache_write reads them (copied only if a token's heads are not back to back), and
    whether the 16-byte path applies."""
    if not (rows_contiguous(key) and rows_contiguous(value)):
        key, value = key.contiguous(), value.contiguous()
    return key, value, can_vectorize(key, value, key_cache, value_cache)


@dataclass(frozen=True)
class AttentionLaunch:
    """Outputs and split plan of one decode-attention launch (tmp tensors are 1-element when unsplit)."""

    out: torch.Tensor  # [batch, num_q_heads, head_dim], the query's dtype
    tmp_out: torch.Tensor  # [batch, num_q_heads, num_splits, head_dim] fp32
    tmp_max: torch.Tensor  # [batch, num_q_heads, num_splits] fp32
    tmp_sum: torch.Tensor  # [batch, num_q_heads, num_splits] fp32
    group: int
    tokens_per_split: int
    num_splits: int


def plan_attention(query: torch.Tensor, num_kv_heads: int, max_seq_len: int, num_sms: int,
                   tokens_per_split: int | None = None, total_tokens: int | None = None) -> AttentionLaunch:
    batch, num_q_heads, head_dim = query.shape
    group = num_q_heads // num_kv_heads
    reason = unsupported_reason(head_dim, group)
    if reason is not None:
        raise ValueError(reason)
    if batch > MAX_GRID_YZ:
        raise ValueError(f"a batch of {batch} sequences exceeds the attention grid's limit of {MAX_GRID_YZ}; "
                         "split it into several calls")
    tokens_per_split, num_splits = plan_splits(batch, num_kv_heads, max_seq_len, num_sms, tokens_per_split,
                                               total_tokens)
    if num_splits > MAX_GRID_YZ:
        raise ValueError(f"{num_splits} splits of {tokens_per_split} tokens exceed the grid's limit of "
                         f"{MAX_GRID_YZ}; use longer splits")
    split_shape = (batch, num_q_heads, num_splits) if num_splits > 1 else (1,)
    scratch = {"device": query.device, "dtype": torch.float32}  # the kernels write float, whatever torch's default
    return AttentionLaunch(
        out=_unwritten(query.shape, device=query.device, dtype=query.dtype),
        tmp_out=_unwritten((*split_shape, head_dim) if num_splits > 1 else (1,), **scratch),
        tmp_max=_unwritten(split_shape, **scratch),
        tmp_sum=_unwritten(split_shape, **scratch),
        group=group, tokens_per_split=tokens_per_split, num_splits=num_splits)


def _unwritten(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """Memory a kernel must write before anything reads it: uninitialised on a GPU; NaN on the CPU, where the
    emulated kernels run, so that a kernel reading what it never wrote (a merge over one split too many) shows."""
    if device.type == "cpu":
        return torch.full(shape, float("nan"), device=device, dtype=dtype)
    return torch.empty(shape, device=device, dtype=dtype)


def random_block_tables(seq_lens: list[int], num_blocks: int, block_size: int,
                        generator: torch.Generator) -> torch.Tensor:
    """[batch, max blocks] int32 tables (-1 padded) whose blocks are distinct and in random order: what a busy
    pool hands out, for benchmarks."""
    needed = [-(-length // block_size) for length in seq_lens]
    order = torch.randperm(num_blocks, generator=generator)[: sum(needed)].to(torch.int32)
    tables = torch.full((len(seq_lens), max(needed)), -1, dtype=torch.int32)
    start = 0
    for row, count in enumerate(needed):
        tables[row, :count] = order[start:start + count]
        start += count
    return tables


@dataclass(frozen=True)
class Int64:
    """An argument the kernel declares int64_t (the others are int or float, tensors are pointers)."""

    value: int


KernelArg = torch.Tensor | None | Int64 | int | float  # None: a null pointer (scales of a cache that is not fp8)


def argument_types(args: list[KernelArg]) -> str:
    """The C types of ``args`` as PyCUDA's prepared calls spell them: P pointer, q int64, f float, i int."""
    return "".join("P" if arg is None or isinstance(arg, torch.Tensor) else "q" if isinstance(arg, Int64)
                   else "f" if isinstance(arg, float) else "i" for arg in args)


def convert_args(args: list[KernelArg], pointer: Any, int64: Any, float32: Any, int32: Any) -> list[Any]:
    """Each argument through the launcher's constructor for its C type (tensors become their data pointers)."""
    converted = []
    for arg in args:
        if arg is None:
            converted.append(pointer(0))
        elif isinstance(arg, torch.Tensor):
            converted.append(pointer(arg.data_ptr()))
        elif isinstance(arg, Int64):
            converted.append(int64(arg.value))
        elif isinstance(arg, float):
            converted.append(float32(arg))
        else:
            converted.append(int32(arg))
    return converted


def cache_write_args(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                     slot_mapping: torch.Tensor, vectorized: bool, k_scale: torch.Tensor | None = None,
                     v_scale: torch.Tensor | None = None) -> list[KernelArg]:
    """cache_write_<dtype>'s parameters, in the order cuda/cache_write.cu declares them."""
    _, num_kv_heads, block_size, head_dim = key_cache.shape
    return [key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale, Int64(key.stride(0)),
            Int64(value.stride(0)), num_kv_heads, head_dim, block_size, int(vectorized)]


def attention_args(plan: AttentionLaunch, query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                   block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                   k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> list[KernelArg]:
    """paged_attention_<dtype>_hd<D>_g<G>'s parameters, in the order cuda/paged_attention.cu declares them."""
    return [plan.out, query, key_cache, value_cache, block_tables, seq_lens, k_scale, v_scale, plan.tmp_out,
            plan.tmp_max, plan.tmp_sum, float(scale), key_cache.shape[1], plan.group, key_cache.shape[2],
            block_tables.shape[1], plan.tokens_per_split, plan.num_splits]


def merge_args(plan: AttentionLaunch, seq_lens: torch.Tensor) -> list[KernelArg]:
    """paged_attention_merge_<dtype>_hd<D>'s parameters."""
    return [plan.out, plan.tmp_out, plan.tmp_max, plan.tmp_sum, seq_lens, plan.out.shape[1], plan.num_splits,
            plan.tokens_per_split]


def copy_blocks_args(key_cache: torch.Tensor, value_cache: torch.Tensor,
                     block_mapping: torch.Tensor) -> list[KernelArg]:
    """copy_blocks's parameters, in the order cuda/copy_blocks.cu declares them: 16-byte copies only when both
    caches start aligned and a block is a whole number of 16-byte vectors."""
    block_bytes = key_cache[0].numel() * key_cache.element_size()
    vectorized = block_bytes % 16 == 0 and key_cache.data_ptr() % 16 == 0 and value_cache.data_ptr() % 16 == 0
    return [key_cache, value_cache, block_mapping, Int64(block_bytes), int(vectorized)]
