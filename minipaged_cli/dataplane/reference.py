"""The data plane's two operations in PyTorch: the paged cache write and decode paged attention.

Over 300 lines: each operation's argument checks, its naive reference and its fast versions stay together, so
that the kernels' tests and a reader find the whole contract in one file (fp8's own helpers are in fp8.py).

Each has a deliberately naive version (a Python loop over tokens through the block table, like vLLM's test
reference) and fast versions; the CUDA kernels are tested against the same naive ones. Layouts:

    key_cache, value_cache   [num_blocks, num_kv_heads, block_size, head_dim]   one layer
    key, value               [num_tokens, num_kv_heads, head_dim]               may be strided views of a fused QKV
    slot_mapping             [num_tokens] int64, slot = block * block_size + offset, -1 = skip
    query, out               [batch, num_q_heads, head_dim]                     one decode token per sequence
    block_tables             [batch, max_blocks] int32, -1 padded
    seq_lens                 [batch] int32, >= 0 (a sequence of length 0 attends to nothing: its output is 0)

fp8 caches (``dataplane/fp8.py``): the write quantizes key/value (any of the float dtypes) with per-kv-head scales
k_scale, v_scale float32 [num_kv_heads], attention reads K/V back multiplied by them; 16-bit and fp32 caches hold
the query's dtype and take no scales.

GQA: query head ``h`` reads kv head ``h // (num_q_heads // num_kv_heads)``. Attention accumulates in fp32 for
every dtype and returns the query's dtype. Positions at or beyond ``seq_len`` are never read into the result:
cache memory there may hold anything, NaN included.
"""

from __future__ import annotations

import torch

from minipaged_cli.dataplane.fp8 import check_against_cache, check_scales, is_fp8, read_rows, stored_rows

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


# -- validation --------------------------------------------------------------------------------------------

def check_cache_write(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, k_scale: torch.Tensor | None = None,
                      v_scale: torch.Tensor | None = None) -> None:
    """Raise ValueError unless the arguments describe a valid cache write (checked before any memory is touched)."""
    _check_cache_pair(key_cache, value_cache)
    check_scales(key_cache, k_scale, v_scale)
    num_blocks, num_kv_heads, block_size, head_dim = key_cache.shape
    for name, tensor in (("key", key), ("value", value)):
        if tensor.dim() != 3 or tensor.shape[1:] != (num_kv_heads, head_dim):
            raise ValueError(f"{name} must be [num_tokens, {num_kv_heads}, {head_dim}], got {list(tensor.shape)}")
        check_against_cache(name, tensor, key_cache)
        if tensor.stride(-1) != 1:
            raise ValueError(f"{name} must have unit stride in head_dim, got strides {tensor.stride()}")
    if key.shape[0] != value.shape[0]:
        raise ValueError(f"key has {key.shape[0]} tokens, value {value.shape[0]}")
    if slot_mapping.dim() != 1 or slot_mapping.shape[0] != key.shape[0] or slot_mapping.dtype != torch.int64:
        raise ValueError(f"slot_mapping must be int64 [{key.shape[0]}], got {slot_mapping.dtype} "
                         f"{list(slot_mapping.shape)}")
    if slot_mapping.device != key_cache.device:
        raise ValueError(f"slot_mapping is on {slot_mapping.device}, the cache on {key_cache.device}")
    if slot_mapping.numel():
        low, high = int(slot_mapping.min()), int(slot_mapping.max())
        if low < -1 or high >= num_blocks * block_size:
            raise ValueError(f"slot_mapping holds {low if low < -1 else high}: slots are -1 (skip) or in "
                             f"[0, {num_blocks * block_size})")
        slots, counts = slot_mapping[slot_mapping >= 0].unique(return_counts=True)
        if bool((counts > 1).any()):  # two tokens into one slot race on a GPU
            raise ValueError(f"slot_mapping writes slot {int(slots[counts > 1][0])} more than once: each token "
                             "needs its own slot")


def check_copy_blocks(key_cache: torch.Tensor, value_cache: torch.Tensor, block_mapping: torch.Tensor) -> None:
    """Raise ValueError unless block_mapping is int64 [num_pairs, 2] of (src, dst) block ids in range, on the
    caches' device, with every dst distinct and never a src (the pairs are copied concurrently)."""
    _check_cache_pair(key_cache, value_cache)
    if block_mapping.dim() != 2 or block_mapping.shape[1] != 2 or block_mapping.dtype != torch.int64:
        raise ValueError(f"block_mapping must be int64 [num_pairs, 2], got {block_mapping.dtype} "
                         f"{list(block_mapping.shape)}")
    if block_mapping.device != key_cache.device:
        raise ValueError(f"block_mapping is on {block_mapping.device}, the cache on {key_cache.device}")
    if block_mapping.numel():
        pairs = block_mapping.cpu().tolist()
        num_blocks = key_cache.shape[0]
        bad = next((b for pair in pairs for b in pair if not 0 <= b < num_blocks), None)
        if bad is not None:
            raise ValueError(f"block_mapping holds block {bad}, outside [0, {num_blocks})")
        sources, targets = {s for s, _ in pairs}, [d for _, d in pairs]
        if len(set(targets)) != len(targets) or sources & set(targets):
            raise ValueError("block_mapping copies into one block twice, or into a block another pair reads")


def copy_blocks(key_cache: torch.Tensor, value_cache: torch.Tensor, block_mapping: torch.Tensor) -> None:
    """The reference block copy: key_cache[dst] = key_cache[src] (and V) for every (src, dst) pair."""
    src, dst = block_mapping[:, 0], block_mapping[:, 1]
    key_cache[dst] = key_cache[src]
    value_cache[dst] = value_cache[src]


def check_paged_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                          block_tables: torch.Tensor, seq_lens: torch.Tensor, k_scale: torch.Tensor | None = None,
                          v_scale: torch.Tensor | None = None) -> None:
    """Raise ValueError unless the arguments describe a valid decode attention; no block id is read unchecked."""
    _check_cache_pair(key_cache, value_cache)
    check_scales(key_cache, k_scale, v_scale)
    num_blocks, num_kv_heads, block_size, head_dim = key_cache.shape
    if query.dim() != 3 or query.shape[2] != head_dim:
        raise ValueError(f"query must be [batch, num_q_heads, {head_dim}], got {list(query.shape)}")
    batch, num_q_heads, _ = query.shape
    if num_q_heads % num_kv_heads:
        raise ValueError(f"num_q_heads {num_q_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    check_against_cache("query", query, key_cache)
    if block_tables.dim() != 2 or block_tables.shape[0] != batch or block_tables.dtype != torch.int32:
        raise ValueError(f"block_tables must be int32 [{batch}, max_blocks], got {block_tables.dtype} "
                         f"{list(block_tables.shape)}")
    if seq_lens.shape != (batch,) or seq_lens.dtype != torch.int32:
        raise ValueError(f"seq_lens must be int32 [{batch}], got {seq_lens.dtype} {list(seq_lens.shape)}")
    if block_tables.device != key_cache.device or seq_lens.device != key_cache.device:
        raise ValueError(f"block_tables and seq_lens must be on {key_cache.device}")
    if batch == 0:
        return
    max_blocks = block_tables.shape[1]
    if int(seq_lens.min()) < 0:
        raise ValueError(f"seq_lens must be >= 0, got {int(seq_lens.min())}")
    if int(seq_lens.max()) > max_blocks * block_size:
        raise ValueError(f"seq_len {int(seq_lens.max())} exceeds max_blocks * block_size = {max_blocks * block_size}")
    needed = (seq_lens.long() + block_size - 1) // block_size  # blocks each sequence reads
    used = torch.arange(max_blocks, device=block_tables.device)[None, :] < needed[:, None]
    bad = used & ((block_tables < 0) | (block_tables >= num_blocks))
    if bool(bad.any()):
        row, column = (int(i) for i in bad.nonzero()[0])
        raise ValueError(f"block_tables[{row}, {column}] = {int(block_tables[row, column])} is not a block id in "
                         f"[0, {num_blocks}) but sequence {row} reads {int(needed[row])} blocks")


def _check_cache_pair(key_cache: torch.Tensor, value_cache: torch.Tensor) -> None:
    if key_cache.dim() != 4:
        raise ValueError(f"key_cache must be [num_blocks, num_kv_heads, block_size, head_dim], got "
                         f"{list(key_cache.shape)}")
    if value_cache.shape != key_cache.shape or value_cache.dtype != key_cache.dtype \
            or value_cache.device != key_cache.device:
        raise ValueError("key_cache and value_cache must have the same shape, dtype and device")
    if key_cache.dtype not in _DTYPES and not is_fp8(key_cache.dtype):
        raise ValueError(f"cache dtype must be one of {_DTYPES}, float8_e4m3fn or float8_e5m2, got "
                         f"{key_cache.dtype}")
    if not (key_cache.is_contiguous() and value_cache.is_contiguous()):
        raise ValueError("key_cache and value_cache must be contiguous")


# -- cache write -------------------------------------------------------------------------------------------

def cache_write_naive(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                      slot_mapping: torch.Tensor, k_scale: torch.Tensor | None = None,
                      v_scale: torch.Tensor | None = None) -> None:
    """Token by token: slot -> (block, offset) -> copy that token's heads (quantized into an fp8 cache)."""
    key, value = stored_rows(key, value, key_cache, k_scale, v_scale)
    block_size = key_cache.shape[2]
    for token, slot in enumerate(slot_mapping.tolist()):
        if slot < 0:
            continue
        block, offset = divmod(slot, block_size)
        key_cache[block, :, offset, :] = key[token]
        value_cache[block, :, offset, :] = value[token]


def cache_write(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                slot_mapping: torch.Tensor, k_scale: torch.Tensor | None = None,
                v_scale: torch.Tensor | None = None) -> None:
    """All tokens in one indexed copy per cache."""
    key, value = stored_rows(key, value, key_cache, k_scale, v_scale)
    block_size = key_cache.shape[2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep]
    blocks, offsets = slots // block_size, slots % block_size
    # Advanced indices around a slice put the token dimension first: [n, num_kv_heads, head_dim].
    key_cache[blocks, :, offsets, :] = key[keep]
    value_cache[blocks, :, offsets, :] = value[keep]


# -- decode paged attention --------------------------------------------------------------------------------

def paged_attention_naive(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                          block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                          k_scale: torch.Tensor | None = None, v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Token by token through the block table (like vLLM's test reference), then each query head in fp32."""
    _, num_kv_heads, block_size, _ = key_cache.shape
    group = query.shape[1] // num_kv_heads
    out = torch.zeros_like(query)  # [batch, num_q_heads, head_dim]; a sequence of length 0 keeps zeros
    for seq, seq_len in enumerate(seq_lens.tolist()):
        if seq_len == 0:
            continue
        table = block_tables[seq].tolist()
        keys, values = [], []
        for position in range(seq_len):
            block, offset = table[position // block_size], position % block_size
            keys.append(key_cache[block, :, offset])  # [num_kv_heads, head_dim]
            values.append(value_cache[block, :, offset])
        k = read_rows(torch.stack(keys), k_scale)  # [seq_len, num_kv_heads, head_dim] fp32
        v = read_rows(torch.stack(values), v_scale)
        for head in range(query.shape[1]):
            kv_head = head // group
            probs = torch.softmax(k[:, kv_head] @ query[seq, head].float() * scale, dim=0)  # [seq_len]
            out[seq, head] = (probs @ v[:, kv_head]).to(query.dtype)
    return out


def paged_attention_vectorized(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                               block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                               k_scale: torch.Tensor | None = None,
                               v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Gather one kv head's blocks for a group of sequences (padded to the group's longest), mask, one softmax.

    Memory traffic decides the speed on a CPU: ``index_select`` of one head's blocks lands contiguous as
    [sequences, tokens, head_dim], ready for ``bmm`` with no second copy, into one buffer that K and then V
    reuse and that is small enough to stay in the CPU's cache between the copy and the product. Sequences are
    grouped by length, so a short one is not padded to the longest of the batch.
    """
    batch, num_q_heads, head_dim = query.shape
    _, num_kv_heads, block_size, _ = key_cache.shape
    group = num_q_heads // num_kv_heads
    q = query.float().reshape(batch, num_kv_heads, group, head_dim) * scale
    out = torch.zeros(batch, num_kv_heads, group, head_dim, device=query.device)  # length 0: zeros
    order = torch.argsort(seq_lens, descending=True)
    lengths = seq_lens[order].tolist()
    num_attending = sum(1 for length in lengths if length > 0)  # the sequences of length 0 sort last
    first = 0
    while first < num_attending:
        num_tokens = -(-lengths[first] // block_size) * block_size  # the longest of the group, in whole blocks
        size = max(1, _CACHE_RESIDENT_BYTES // (num_tokens * head_dim * 4))
        rows = order[first:min(first + size, num_attending)]
        first += size
        num_read = num_tokens // block_size
        block_ids = block_tables[rows, :num_read].reshape(-1).long().clamp(min=0)  # -1 padding: masked below
        invalid = torch.arange(num_tokens, device=query.device)[None, :] >= seq_lens[rows, None]
        padding = invalid.nonzero(as_tuple=True)  # (sequence, token) past each sequence's end
        padded = len(padding[0]) > 0
        gathered = torch.empty(block_ids.numel(), block_size, head_dim, dtype=key_cache.dtype, device=query.device)
        as_float = gathered if key_cache.dtype == torch.float32 else torch.empty_like(gathered, dtype=torch.float32)
        x = as_float.view(len(rows), num_tokens, head_dim)  # [sequences in the group, tokens, head_dim]
        # Long rows: the logits as x q^T (tokens down), which CPU GEMMs stream through far faster than q x^T.
        tall = num_tokens > _TALL_TOKENS
        for kv_head in range(num_kv_heads):
            _gather_head(key_cache, kv_head, block_ids, gathered, as_float)
            if k_scale is not None:
                x.mul_(k_scale[kv_head])
            if tall:
                logits = torch.bmm(x, q[rows, kv_head].transpose(1, 2))  # [sequences, tokens, group]
                if padded:
                    logits.masked_fill_(invalid[:, :, None], float("-inf"))
                probs = torch.softmax(logits, dim=1).transpose(1, 2)
            else:
                logits = torch.bmm(q[rows, kv_head], x.transpose(1, 2))  # [sequences, group, tokens]
                if padded:
                    logits.masked_fill_(invalid[:, None, :], float("-inf"))
                probs = torch.softmax(logits, dim=-1)
            _gather_head(value_cache, kv_head, block_ids, gathered, as_float)
            if v_scale is not None:
                x.mul_(v_scale[kv_head])
            if padded:
                x[padding] = 0.0  # select, never multiply: stale slots may hold NaN, and 0 * NaN is NaN
            out[rows, kv_head] = torch.bmm(probs, x)
    return out.view(batch, num_q_heads, head_dim).to(query.dtype)


_CACHE_RESIDENT_BYTES = 8 << 20  # one head's gathered K of a group of sequences, in fp32
_TALL_TOKENS = 2048  # above this many tokens a row's logits are computed tokens-down


def _gather_head(cache: torch.Tensor, kv_head: int, block_ids: torch.Tensor, gathered: torch.Tensor,
                 as_float: torch.Tensor) -> None:
    """cache[block_ids, kv_head] -> gathered [n, block_size, head_dim], and into fp32 ``as_float``."""
    torch.index_select(cache[:, kv_head], 0, block_ids, out=gathered)
    if as_float is not gathered:
        as_float.copy_(gathered)


def paged_attention_online(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                           block_tables: torch.Tensor, seq_lens: torch.Tensor, scale: float,
                           blocks_per_tile: int = 1, k_scale: torch.Tensor | None = None,
                           v_scale: torch.Tensor | None = None) -> torch.Tensor:
    """Single-pass online softmax over tiles of ``blocks_per_tile`` blocks: the CUDA kernel's update rule.

    Per (sequence, kv head) it keeps the running max ``m``, the running sum of exp ``l`` and the unnormalised
    output ``acc`` for all query heads of the group; each tile's logits raise ``m`` and rescale ``l`` and ``acc``
    by exp(m_old - m_new). No array of all logits exists, so the context length is unbounded.
    The kernel applies the same update token by token in each group of lanes and merges the groups at the end;
    larger tiles amortise Python's cost per step.
    """
    batch, num_q_heads, head_dim = query.shape
    if batch == 0:
        return torch.empty_like(query)
    _, num_kv_heads, block_size, _ = key_cache.shape
    group = num_q_heads // num_kv_heads
    q = query.float().reshape(batch, num_kv_heads, group, head_dim) * scale
    running_max = torch.full((batch, num_kv_heads, group, 1), float("-inf"), device=query.device)
    running_sum = torch.zeros((batch, num_kv_heads, group, 1), device=query.device)
    acc = torch.zeros((batch, num_kv_heads, group, head_dim), device=query.device)
    num_read = -(-int(seq_lens.max()) // block_size)
    for first in range(0, num_read, blocks_per_tile):
        tables = block_tables[:, first:first + blocks_per_tile].long().clamp(min=0)
        positions = first * block_size + torch.arange(tables.shape[1] * block_size, device=query.device)
        valid = positions[None, :] < seq_lens[:, None]  # [batch, tile_tokens]
        live = valid.any(dim=1)
        if not bool(live.any()):
            break
        keys = _gather(key_cache, tables, k_scale)  # [batch, num_kv_heads, tile_tokens, head_dim]
        values = torch.where(valid[:, None, :, None], _gather(value_cache, tables, v_scale), 0.0)
        logits = torch.einsum("bkgd,bktd->bkgt", q, keys).masked_fill(~valid[:, None, None, :], float("-inf"))
        tile_max = logits.amax(dim=-1, keepdim=True)
        new_max = torch.maximum(running_max, tile_max)
        # A sequence already past its end sees only -inf: keep its state (exp(-inf - -inf) would be NaN).
        new_max = torch.where(live[:, None, None, None], new_max, running_max)
        correction = torch.where(live[:, None, None, None], torch.exp(running_max - new_max), 1.0)
        probs = torch.exp(logits - new_max)  # masked positions: exp(-inf) = 0
        probs = torch.where(valid[:, None, None, :], probs, 0.0)
        running_sum = running_sum * correction + probs.sum(dim=-1, keepdim=True)
        acc = acc * correction + torch.einsum("bkgt,bktd->bkgd", probs, values)
        running_max = new_max
    out = torch.where(running_sum > 0, acc / running_sum, 0.0)  # a sequence of length 0 saw no token: zeros
    return out.reshape(batch, num_q_heads, head_dim).to(query.dtype)


def _gather(cache: torch.Tensor, tables: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """[batch, n] block ids -> [batch, num_kv_heads, n * block_size, head_dim] in fp32 (dequantized)."""
    blocks = cache[tables]  # [batch, n, num_kv_heads, block_size, head_dim]
    batch, n, num_kv_heads, block_size, head_dim = blocks.shape
    rows = blocks.permute(0, 2, 1, 3, 4).reshape(batch, num_kv_heads, n * block_size, head_dim).float()
    return rows if scale is None else rows * scale[:, None, None]

