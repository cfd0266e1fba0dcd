"""The block manager's tables as the kernels read them: slot mappings, the padded block-table tensor, sequence
lengths. The memory layer keeps Python lists and never imports torch; arrays are built here, at the boundary."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from minipaged_cli.memory.block_manager import KVBlockManager


def slot_mapping(block_table: Sequence[int], block_size: int, positions: np.ndarray) -> np.ndarray:
    """``[len(positions)]`` int64: slot = block_table[pos // block_size] * block_size + pos % block_size."""
    table = np.asarray(block_table, dtype=np.int64)
    return table[positions // block_size] * block_size + positions % block_size


def append_slots(manager: KVBlockManager, sequence_id: Hashable, num_tokens: int) -> list[int]:
    """Give the sequence's next ``num_tokens`` tokens their slots (``KVBlockManager.grow``) and return them."""
    start = manager.sequence(sequence_id).sequence_length
    state = manager.grow(sequence_id, num_tokens)
    return slot_mapping(state.block_table, manager.block_size, np.arange(start, start + num_tokens)).tolist()


def block_table_tensor(manager: KVBlockManager, sequence_ids: Sequence[Hashable], *, as_torch: bool = False) -> Any:
    """``[batch, max_blocks]`` int32 block tables of the manager's sequences, padded with -1: NumPy, or
    (``as_torch``) a CPU ``torch.Tensor`` sharing its memory."""
    return padded_block_tables([manager.sequence(sid).block_table for sid in sequence_ids], as_torch=as_torch)


def padded_block_tables(tables: Sequence[Sequence[int]], *, as_torch: bool = False) -> Any:
    """``[batch, max_blocks]`` int32: the given block tables, padded with -1 (NumPy, or a CPU torch.Tensor)."""
    width = max((len(t) for t in tables), default=0)
    out = np.full((len(tables), width), -1, dtype=np.int32)  # [batch, max_blocks]
    for row, table in enumerate(tables):
        out[row, : len(table)] = table
    return _maybe_torch(out, as_torch)


def seq_lens_tensor(manager: KVBlockManager, sequence_ids: Sequence[Hashable], *, as_torch: bool = False) -> Any:
    """``[batch]`` int32 sequence lengths: NumPy, or (``as_torch``) a CPU ``torch.Tensor``."""
    lens = np.array([manager.sequence(sid).sequence_length for sid in sequence_ids], dtype=np.int32)
    return _maybe_torch(lens, as_torch)


def _maybe_torch(array: np.ndarray, as_torch: bool) -> Any:
    if not as_torch:
        return array
    import torch  # importing this module must not need torch: the arrays serve NumPy users too

    return torch.from_numpy(array)
