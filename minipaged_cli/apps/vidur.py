"""Vidur's measured profiles (microsoft/vidur's ``mlp.csv``) as a calibration: its weight GEMMs and element-wise
kernels of one layer, by token count. Reads a CSV only, so it needs no torch (unlike measuring on a device)."""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from minipaged_cli.errors import InputError
from minipaged_cli.sim.calibration import Calibration, Table
from minipaged_cli.validation import finite_number, number_from_text, positive_number, whole_number
from minipaged_cli.workloads.presets import ModelSpec

VIDUR_GEMMS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")  # QKV, O, gate+up, down
# The rest of a layer but attention, as Vidur's ExecutionTime sums it (one residual add per layer).
VIDUR_ELEMENTWISE = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add")


def from_vidur(path: Path, model: ModelSpec, gpu: str) -> Calibration:
    """The ``linear`` and ``elementwise`` tables of a Vidur ``mlp.csv`` (tensor parallelism 1; the median of each
    op, in ms; the median of repeated rows)."""
    gemms, elementwise = ([f"time_stats.{op}.median" for op in ops] for ops in (VIDUR_GEMMS, VIDUR_ELEMENTWISE))
    source = str(path)
    try:
        with open(path, newline="") as file:
            reader = csv.DictReader(file)
            rows, header = list(reader), reader.fieldnames or []
    except (OSError, UnicodeDecodeError, csv.Error) as error:
        raise InputError(f"cannot read: {getattr(error, 'strerror', None) or error}", source=source,
                         field="{from_vidur}") from None
    for column in (*gemms, *elementwise, "num_tokens"):
        if column not in header:
            raise InputError("missing column (expected Vidur's mlp.csv)", source=source, field=column)
    times: dict[int, list[tuple[float, float]]] = {}
    for i, row in enumerate(rows):
        where = f"row {i + 2}"
        if None in row or None in row.values():  # csv's marks for cells past the header's, or missing
            raise InputError(f"expected {len(header)} cells, as the header names", source=source, where=where)
        if row.get("num_tensor_parallel_workers", "1") != "1":
            continue
        tokens = whole_number(number_from_text(row["num_tokens"]), source=source, where=where,
                              field="num_tokens", minimum=1)
        gemm_s, elementwise_s = (_seconds(row, columns, source, where) for columns in (gemms, elementwise))
        times.setdefault(tokens, []).append((gemm_s, elementwise_s))
    if not times:
        raise InputError("no rows with num_tensor_parallel_workers 1", source=source)
    sizes = np.array(sorted(times), dtype=np.float64)
    medians = np.array([np.median(times[int(s)], axis=0) for s in sizes])
    return Calibration(gpu=gpu, model=model, path=source,
                       source=f"Vidur's profile {path.name} (microsoft/vidur, MIT): the weight GEMMs of one layer "
                              f"({', '.join(VIDUR_GEMMS)}) and its element-wise kernels "
                              f"({', '.join(VIDUR_ELEMENTWISE)}), tensor parallelism 1, the median of each op; the "
                              "median of repeated rows",
                       linear=Table(sizes, medians[:, 0]), elementwise=Table(sizes, medians[:, 1]))


def _seconds(row: dict[str, str], columns: list[str], source: str, where: str) -> float:
    """The columns' times (ms, each finite and >= 0) summed, in seconds (> 0)."""
    total = sum(finite_number(number_from_text(row[column]), source=source, where=where, field=column,
                              minimum=0.0) for column in columns)
    return positive_number(total / 1e3, source=source, where=where, field=" + ".join(columns))
