"""Multi-head latent attention (DeepSeek-V2/V3) over a paged latent cache: the cache write, decode attention in
the absorbed form, and prefill in the expanded form, in PyTorch.

An MLA layer caches no per-head K or V. Each token leaves one vector, ``[kv_c ; k_pe]``: the compressed KV
(``kv_lora_rank`` elements, after ``kv_a_layernorm``) and the rotary key shared by every head
(``qk_rope_head_dim`` elements, after RoPE). Per head, K is ``[kv_c W_UK ; k_pe]`` and V is ``kv_c W_UV``.

Decode (vLLM's "data-movement friendly" form): the query is moved into latent space once,
``q_latent = q_nope W_UK^T``, so that ``q_nope . (kv_c W_UK) = q_latent . kv_c`` and every head reads the same
latent rows: attention is multi-query with head_dim ``kv_lora_rank + qk_rope_head_dim`` over ``[kv_c ; k_pe]``,
its output stays in latent space and ``W_UV`` maps it to each head's V space at the end. A decode step reads each
context token's latent row once, whatever the number of heads. Prefill (the "compute friendly" form) expands the
latents into per-head K and V and attends causally. Layouts:

    latent_cache    [num_blocks, block_size, kv_lora_rank + qk_rope_head_dim]   one layer
    kv_c            [num_tokens, kv_lora_rank]
    k_pe            [num_tokens, qk_rope_head_dim]
    slot_mapping    [num_tokens] int64, slot = block * block_size + offset, -1 = skip
    q_nope          [num_queries, num_heads, qk_nope_head_dim]
    q_pe            [num_queries, num_heads, qk_rope_head_dim]
    w_uk            [kv_lora_rank, num_heads, qk_nope_head_dim]
    w_uv            [kv_lora_rank, num_heads, v_head_dim]
    block_tables    [batch, max_blocks] int32, -1 padded
    seq_lens        [batch] int32: the tokens each sequence attends to (a sequence of length 0 attends to nothing)
    out             [num_queries, num_heads, v_head_dim]

Attention accumulates in fp32 and returns the query's dtype. Positions at or beyond a sequence's length are never
read: cache memory there may hold anything, NaN included.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass
from functools import cache

import torch

from minipaged_cli.dataplane import emulation, kernels
from minipaged_cli.dataplane.build import build_library
from minipaged_cli.dataplane.kernel_backend import KernelBackend
from minipaged_cli.dataplane.reference import check_cache_write, check_paged_attention

# cuda/mla_decode.cu's limits and launch shape (MLA_MAX_RANK, MLA_MAX_ROW, MLA_HEADS, MLA_THREADS there).
KERNEL_MAX_RANK, KERNEL_MAX_ROW = 512, 576
KERNEL_HEADS, KERNEL_THREADS = 8, 128


@dataclass(frozen=True)
class MLAWeights:
    """The up-projections out of the latent: ``w_uk`` [kv_lora_rank, num_heads, qk_nope_head_dim] gives each
    head's non-rotary key, ``w_uv`` [kv_lora_rank, num_heads, v_head_dim] its value."""

    w_uk: torch.Tensor
    w_uv: torch.Tensor

    def __post_init__(self) -> None:
        if self.w_uk.dim() != 3 or self.w_uv.dim() != 3 or self.w_uk.shape[:2] != self.w_uv.shape[:2]:
            raise ValueError(f"w_uk must be [kv_lora_rank, num_heads, qk_nope_head_dim] and w_uv [kv_lora_rank, "
                             f"num_heads, v_head_dim], got {list(self.w_uk.shape)} and {list(self.w_uv.shape)}")

    @classmethod
    def from_kv_b_proj(cls, weight: torch.Tensor, num_heads: int, qk_nope_head_dim: int,
                       v_head_dim: int) -> MLAWeights:
        """Split Hugging Face's / DeepSeek's ``kv_b_proj.weight`` [num_heads * (qk_nope_head_dim + v_head_dim),
        kv_lora_rank]: its output, per head, is the non-rotary key followed by the value."""
        per_head = qk_nope_head_dim + v_head_dim
        if weight.dim() != 2 or weight.shape[0] != num_heads * per_head:
            raise ValueError(f"kv_b_proj.weight must be [{num_heads} * {per_head}, kv_lora_rank], got "
                             f"{list(weight.shape)}")
        up = weight.t().reshape(weight.shape[1], num_heads, per_head)  # [kv_lora_rank, num_heads, per_head]
        return cls(w_uk=up[..., :qk_nope_head_dim], w_uv=up[..., qk_nope_head_dim:])

    @property
    def kv_lora_rank(self) -> int:
        return self.w_uk.shape[0]

    @property
    def num_heads(self) -> int:
        return self.w_uk.shape[1]

    @property
    def qk_nope_head_dim(self) -> int:
        return self.w_uk.shape[2]

    @property
    def v_head_dim(self) -> int:
        return self.w_uv.shape[2]


class PagedLatentCache:
    """Per layer ``latent_cache[layer]``: [num_blocks, block_size, kv_lora_rank + qk_rope_head_dim] (vLLM's MLA
    layout), the latent vector ``[kv_c ; k_pe]`` of one token per row.

    Slot ``s`` of a layer is ``latent_cache[layer][s // block_size, s % block_size]``; the block manager's block
    tables and slot mappings index every layer alike, as with ``PagedKVCache``. A token costs one row per layer,
    ``bytes_per_token_per_layer``, which is what a decode step reads per context token and layer. The memory is
    left uninitialised: what was never written is never read.
    """

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, kv_lora_rank: int, qk_rope_head_dim: int,
                 dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu") -> None:
        for name, value in (("num_layers", num_layers), ("num_blocks", num_blocks), ("block_size", block_size),
                            ("kv_lora_rank", kv_lora_rank), ("qk_rope_head_dim", qk_rope_head_dim)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.kv_lora_rank = kv_lora_rank
        shape = (num_blocks, block_size, kv_lora_rank + qk_rope_head_dim)
        self.latent_cache = [torch.empty(shape, dtype=dtype, device=device) for _ in range(num_layers)]

    @property
    def shape(self) -> tuple[int, int, int]:
        """[num_blocks, block_size, kv_lora_rank + qk_rope_head_dim] of each layer's tensor."""
        return tuple(self.latent_cache[0].shape)  # type: ignore[return-value]

    @property
    def num_layers(self) -> int:
        return len(self.latent_cache)

    @property
    def num_blocks(self) -> int:
        return self.shape[0]

    @property
    def block_size(self) -> int:
        return self.shape[1]

    @property
    def qk_rope_head_dim(self) -> int:
        return self.shape[2] - self.kv_lora_rank

    @property
    def dtype(self) -> torch.dtype:
        return self.latent_cache[0].dtype

    @property
    def bytes_per_token_per_layer(self) -> int:
        """One row of the layout: the step from one token to the next in a block, in bytes."""
        cache = self.latent_cache[0]
        return cache.stride(1) * cache.element_size()

    @property
    def bytes_per_token(self) -> int:
        return self.num_layers * self.bytes_per_token_per_layer

    @property
    def memory_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.latent_cache)


# -- cache write -------------------------------------------------------------------------------------------

def latent_cache_write(kv_c: torch.Tensor, k_pe: torch.Tensor, latent_cache: torch.Tensor,
                       slot_mapping: torch.Tensor) -> None:
    """kv_c [num_tokens, kv_lora_rank] and k_pe [num_tokens, qk_rope_head_dim] -> one latent row per token at
    ``slot_mapping`` [num_tokens] (-1: skip); vLLM's ``concat_and_cache_mla``. ValueError before any write when
    an argument is wrong."""
    if latent_cache.dim() != 3:
        raise ValueError(f"latent_cache must be [num_blocks, block_size, kv_lora_rank + qk_rope_head_dim], got "
                         f"{list(latent_cache.shape)}")
    if kv_c.dim() != 2 or k_pe.dim() != 2 or kv_c.shape[0] != k_pe.shape[0] \
            or kv_c.shape[1] + k_pe.shape[1] != latent_cache.shape[2]:
        raise ValueError(f"kv_c [num_tokens, kv_lora_rank] and k_pe [num_tokens, qk_rope_head_dim] must fill a "
                         f"row of {latent_cache.shape[2]}, got {list(kv_c.shape)} and {list(k_pe.shape)}")
    if kv_c.dtype != latent_cache.dtype or k_pe.dtype != latent_cache.dtype:  # torch.cat would promote silently
        raise ValueError(f"kv_c is {kv_c.dtype} and k_pe {k_pe.dtype}; the cache is {latent_cache.dtype}")
    entry = torch.cat((kv_c, k_pe), dim=1)  # [num_tokens, kv_lora_rank + qk_rope_head_dim]
    # The latent cache is a K/V cache with one head whose K and V are the same row: the paged write's checks
    # (dtype, device, slot range, no slot written twice) apply unchanged.
    single_head = latent_cache.unsqueeze(1)  # [num_blocks, 1, block_size, entry]
    check_cache_write(entry[:, None], entry[:, None], single_head, single_head, slot_mapping)
    keep = slot_mapping >= 0
    latent_cache.view(-1, latent_cache.shape[2])[slot_mapping[keep]] = entry[keep]


# -- attention ---------------------------------------------------------------------------------------------

def mla_decode(q_nope: torch.Tensor, q_pe: torch.Tensor, latent_cache: torch.Tensor, block_tables: torch.Tensor,
               seq_lens: torch.Tensor, weights: MLAWeights, scale: float,
               backend: KernelBackend | None = None) -> torch.Tensor:
    """One decode query per sequence, absorbed: q_nope [batch, num_heads, qk_nope_head_dim] and q_pe [batch,
    num_heads, qk_rope_head_dim] over each sequence's first ``seq_lens`` latent rows -> [batch, num_heads,
    v_head_dim]. ``scale`` multiplies q.k of the full (nope + rope) head, as in the expanded form. The attention
    over the latent rows runs in PyTorch, or with ``backend`` (``CudaBackend``, or ``EmulatedBackend(library=
    emulated_library())``) as cuda/mla_decode.cu; the two projections are matrix products either way."""
    _check_queries(q_nope, q_pe, latent_cache, weights)
    q_latent = torch.einsum("bnp,lnp->bnl", q_nope.float(), weights.w_uk.float())  # [batch, num_heads, L]
    query = torch.cat((q_latent, q_pe.float()), dim=-1)  # [batch, num_heads, L + R]: MQA over the latent rows
    _check_tables(query.to(latent_cache.dtype), latent_cache, block_tables, seq_lens)
    if backend is None:
        out_latent = latent_attention(query, latent_cache, block_tables, seq_lens, scale, weights.kv_lora_rank)
    else:
        out_latent = launch_latent_attention(backend, query, latent_cache, block_tables, seq_lens, scale,
                                             weights.kv_lora_rank)
    return torch.einsum("bnl,lnv->bnv", out_latent, weights.w_uv.float()).to(q_nope.dtype)


def latent_attention(query: torch.Tensor, latent_cache: torch.Tensor, block_tables: torch.Tensor,
                     seq_lens: torch.Tensor, scale: float, kv_lora_rank: int) -> torch.Tensor:
    """The absorbed core in PyTorch: query [batch, num_heads, L + R] (fp32) scores each sequence's latent rows,
    and the probabilities weigh their kv_c -> [batch, num_heads, L] in fp32 (a sequence of length 0: zeros)."""
    out = torch.zeros(*query.shape[:2], kv_lora_rank, device=query.device)
    for seq, latents in enumerate(_read_context(latent_cache, block_tables, seq_lens)):
        if len(latents) == 0:
            continue
        x = latents.float()  # [seq_len, L + R]
        probs = torch.softmax(query[seq] @ x.t() * scale, dim=-1)  # [num_heads, seq_len]
        out[seq] = probs @ x[:, :kv_lora_rank]  # V in latent space is kv_c itself
    return out


def launch_latent_attention(backend: KernelBackend, query: torch.Tensor, latent_cache: torch.Tensor,
                            block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                            kv_lora_rank: int) -> torch.Tensor:
    """``latent_attention`` as cuda/mla_decode.cu: one thread block per (sequence, KERNEL_HEADS heads)."""
    batch, num_heads, row_width = query.shape
    if kv_lora_rank > KERNEL_MAX_RANK or row_width > KERNEL_MAX_ROW:
        raise ValueError(f"cuda/mla_decode.cu covers kv_lora_rank <= {KERNEL_MAX_RANK} and kv_lora_rank + "
                         f"qk_rope_head_dim <= {KERNEL_MAX_ROW}, not {kv_lora_rank} + {row_width - kv_lora_rank}")
    if batch > kernels.MAX_GRID_YZ:
        raise ValueError(f"cuda/mla_decode.cu takes at most {kernels.MAX_GRID_YZ} sequences, got {batch}")
    out = torch.empty(batch, num_heads, kv_lora_rank, device=query.device)
    if batch == 0:  # a grid cannot be empty
        return out
    backend.launch("mla_decode", f"mla_decode_{kernels.SUFFIX[latent_cache.dtype]}",
                   (-(-num_heads // KERNEL_HEADS), batch, 1), (KERNEL_THREADS, 1, 1),
                   [out, query.contiguous(), latent_cache, block_tables.contiguous(), seq_lens.contiguous(),
                    float(scale), num_heads, kv_lora_rank, row_width, latent_cache.shape[1], block_tables.shape[1]])
    return out


@cache
def emulated_library() -> ctypes.CDLL:
    """cuda/mla_decode.cu compiled for the CPU against cuda_emu.h (once per source version, cached like the other
    kernels' emulation): pass it to ``EmulatedBackend(library=...)``."""
    sources = ("emulation/mla_emu.cpp", "emulation/cuda_emu.h", "mla_decode.cu", "common.cuh")
    return build_library("mla_emu", sources, "emulation/mla_emu.cpp", emulation.FLAGS)


def mla_prefill(q_nope: torch.Tensor, q_pe: torch.Tensor, latent_cache: torch.Tensor, block_tables: torch.Tensor,
                seq_lens: torch.Tensor, query_lens: torch.Tensor, weights: MLAWeights, scale: float) -> torch.Tensor:
    """Causal attention of new tokens, expanded: sequence i's ``query_lens[i]`` queries (q_nope [num_queries,
    num_heads, qk_nope_head_dim], q_pe likewise, sequences one after another) are its last positions up to
    ``seq_lens[i]``, already written to the cache; each attends to the positions up to its own -> [num_queries,
    num_heads, v_head_dim]. Chunked prefill is the case ``query_lens < seq_lens``."""
    _check_queries(q_nope, q_pe, latent_cache, weights)
    if query_lens.dim() != 1 or query_lens.dtype != torch.int32 or query_lens.device != latent_cache.device:
        raise ValueError(f"query_lens must be int32 [batch] on {latent_cache.device}, got {query_lens.dtype} "
                         f"{list(query_lens.shape)} on {query_lens.device}")
    stand_in = latent_cache.new_empty(len(query_lens), 1, latent_cache.shape[2])  # [batch, 1, L + R], never read
    _check_tables(stand_in, latent_cache, block_tables, seq_lens)
    if bool((query_lens < 0).any() | (query_lens > seq_lens).any()):
        raise ValueError("query_lens must be in [0, seq_lens]: the queries are a sequence's last positions")
    if int(query_lens.sum()) != q_nope.shape[0]:
        raise ValueError(f"query_lens sum to {int(query_lens.sum())}, the queries are {q_nope.shape[0]}")
    rank = weights.kv_lora_rank
    w_uk, w_uv = weights.w_uk.float(), weights.w_uv.float()
    query = torch.cat((q_nope, q_pe), dim=-1).float()  # [num_queries, num_heads, P + R]
    outs = []
    starts = torch.cumsum(query_lens, 0).tolist()
    for seq, latents in enumerate(_read_context(latent_cache, block_tables, seq_lens)):
        num_queries = int(query_lens[seq])
        if num_queries == 0:
            continue
        x = latents.float()  # [seq_len, L + R]
        k_nope = torch.einsum("tl,lnp->tnp", x[:, :rank], w_uk)
        k_pe = x[:, None, rank:].expand(-1, weights.num_heads, -1)  # one rotary key shared by every head
        key = torch.cat((k_nope, k_pe), dim=-1)  # [seq_len, num_heads, P + R]
        value = torch.einsum("tl,lnv->tnv", x[:, :rank], w_uv)  # [seq_len, num_heads, V]
        q = query[starts[seq] - num_queries:starts[seq]]  # [num_queries, num_heads, P + R]
        logits = torch.einsum("qnd,tnd->nqt", q, key) * scale
        positions = torch.arange(len(x), device=x.device)
        query_positions = positions[len(x) - num_queries:]
        logits.masked_fill_(positions[None, None, :] > query_positions[None, :, None], float("-inf"))
        outs.append(torch.einsum("nqt,tnv->qnv", torch.softmax(logits, dim=-1), value))
    if not outs:
        return q_nope.new_empty(0, weights.num_heads, weights.v_head_dim)
    return torch.cat(outs).to(q_nope.dtype)


def _read_context(latent_cache: torch.Tensor, block_tables: torch.Tensor,
                  seq_lens: torch.Tensor) -> list[torch.Tensor]:
    """Each sequence's latent rows [seq_len, L + R], read once, in one gather of exactly the tokens attended to
    (no padding, no position past a sequence's end)."""
    block_size, width = latent_cache.shape[1], latent_cache.shape[2]
    lens = seq_lens.long()
    owner = torch.repeat_interleave(torch.arange(len(lens), device=lens.device), lens)  # [total tokens]
    first_rows = torch.cumsum(lens, 0) - lens  # where each sequence starts in the gather
    positions = torch.arange(len(owner), device=lens.device) - first_rows[owner]  # [total tokens]
    blocks = block_tables.long()[owner, positions // block_size]
    rows = latent_cache.view(-1, width).index_select(0, blocks * block_size + positions % block_size)
    return list(torch.split(rows, lens.tolist()))


def _check_queries(q_nope: torch.Tensor, q_pe: torch.Tensor, latent_cache: torch.Tensor,
                   weights: MLAWeights) -> None:
    if latent_cache.dim() != 3:
        raise ValueError(f"latent_cache must be [num_blocks, block_size, kv_lora_rank + qk_rope_head_dim], got "
                         f"{list(latent_cache.shape)}")
    rope = latent_cache.shape[2] - weights.kv_lora_rank
    expected = {"q_nope": weights.qk_nope_head_dim, "q_pe": rope}
    for name, tensor in (("q_nope", q_nope), ("q_pe", q_pe)):
        if tensor.dim() != 3 or tensor.shape[1:] != (weights.num_heads, expected[name]) \
                or tensor.shape[0] != q_nope.shape[0]:
            raise ValueError(f"{name} must be [num_queries, {weights.num_heads}, {expected[name]}] (the weights' "
                             f"heads, the cache's row of {latent_cache.shape[2]} = kv_lora_rank "
                             f"{weights.kv_lora_rank} + rope), got {list(tensor.shape)}")


def _check_tables(query: torch.Tensor, latent_cache: torch.Tensor, block_tables: torch.Tensor,
                  seq_lens: torch.Tensor) -> None:
    """The latent cache is read as a single-head K/V cache: decode attention's checks of the block tables and
    lengths (dtypes, devices, block ids in range for every block a sequence reads) apply unchanged."""
    single_head = latent_cache.unsqueeze(1)  # [num_blocks, 1, block_size, L + R]
    check_paged_attention(query, single_head, single_head, block_tables, seq_lens)
