"""Measured step-time tables (``configs/calibrations/``, or ``minipaged calibrate`` on your own GPU).

A calibration file is YAML; every table holds seconds for **one layer** of the measured model:

    gpu: h100                      # the GPU preset it was measured on (simulate refuses another)
    model: {name: llama-2-7b, hidden_size: 4096, ...}   # the measured shapes, Hugging Face config keys
    source: where the numbers come from
    linear:            {tokens: [...], seconds: [...]}  # the weight GEMMs (QKV, O, MLP) on that many tokens
    elementwise:       {tokens: [...], seconds: [...]}  # the norms, RoPE, the MLP's activation, the residual add
    prefill_attention: {tokens: [...], seconds: [...]}  # causal attention over one prompt of that many tokens
    decode_attention:  {batch: [...], context: [...], seconds: [[...], ...]}  # a row per batch size
    cache_write:       {tokens: [...], seconds: [...]}  # writing that many tokens' K and V

Every table but ``linear`` is optional: the efficiency model covers what is missing. Between grid points the
time is interpolated linearly; below the first it stays at the first point's; beyond the last it follows the
efficiency model's shape for that term, scaled to meet the last point (``sim/step_time.py`` passes the shape):
causal prefill attention grows with the square of the prompt, the GEMMs linearly with a constant part (the
weights), decode attention, cache writes and the element-wise kernels in proportion to what they read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from minipaged_cli.errors import InputError
from minipaged_cli.input_files import read_mapping
from minipaged_cli.validation import positive_number, token_count
from minipaged_cli.workloads.presets import ModelSpec, model_from_hf_config

_SHAPE_FIELDS = ("num_layers", "hidden_size", "intermediate_size", "num_q_heads", "num_kv_heads", "head_dim",
                 "gated_mlp", "dtype")
# ModelSpec fields as Hugging Face config keys, for writing a calibration's model back out.
_HF_KEYS = {"num_layers": "num_hidden_layers", "hidden_size": "hidden_size",
            "intermediate_size": "intermediate_size", "num_q_heads": "num_attention_heads",
            "num_kv_heads": "num_key_value_heads", "head_dim": "head_dim", "vocab_size": "vocab_size",
            "tie_word_embeddings": "tie_word_embeddings", "dtype": "torch_dtype",
            "max_model_len": "max_position_embeddings"}


TABLES = ("linear", "elementwise", "prefill_attention", "decode_attention", "cache_write")


def _proportional(size: Any) -> Any:
    return size


def _interp(x: Any, xs: np.ndarray, ys: np.ndarray, shape: Callable[[Any], Any] = _proportional) -> Any:
    """Linear between points, flat below the first; beyond the last, the last point times shape(x) / shape(last)."""
    if np.ndim(x) == 0:  # one step of the replay: no arrays to build
        return ys[-1] * shape(x) / shape(xs[-1]) if x > xs[-1] else np.interp(x, xs, ys)
    return np.where(x > xs[-1], ys[-1] * shape(np.maximum(x, xs[-1])) / shape(xs[-1]), np.interp(x, xs, ys))


@dataclass(frozen=True)
class Table:
    """Seconds against one size (tokens)."""

    sizes: np.ndarray
    seconds: np.ndarray

    def __call__(self, size: Any, shape: Callable[[Any], Any] = _proportional) -> Any:
        """The time at ``size``; beyond the last point it scales as ``shape`` does (a function of the size with
        the term's law: the efficiency model's time for it, say), by default in proportion to the size."""
        return _interp(size, self.sizes, self.seconds, shape)

    def to_dict(self, key: str = "tokens") -> dict[str, list[float]]:
        return {key: [int(s) for s in self.sizes], "seconds": [float(f"{t:.6g}") for t in self.seconds]}


@dataclass(frozen=True)
class Grid:
    """Seconds against batch size and context length per sequence: linear in each, proportional beyond (decode
    attention reads every sequence's K/V once: the efficiency model's time is proportional to batch x context)."""

    batch: np.ndarray
    context: np.ndarray
    seconds: np.ndarray  # (batch, context)

    def __call__(self, batch: int, context: Any) -> Any:
        rows = [_interp(context, self.context, row) for row in self.seconds]
        if batch >= self.batch[-1]:
            return rows[-1] * batch / self.batch[-1]
        upper = int(np.searchsorted(self.batch, batch))
        if upper == 0:
            return rows[0]
        lower = upper - 1
        weight = (batch - self.batch[lower]) / (self.batch[upper] - self.batch[lower])
        return rows[lower] * (1 - weight) + rows[upper] * weight

    def to_dict(self) -> dict[str, Any]:
        return {"batch": [int(b) for b in self.batch], "context": [int(c) for c in self.context],
                "seconds": [[float(f"{t:.6g}") for t in row] for row in self.seconds]}


@dataclass(frozen=True)
class Calibration:
    gpu: str
    model: ModelSpec
    source: str
    linear: Table | None = None
    elementwise: Table | None = None
    prefill_attention: Table | None = None
    decode_attention: Grid | None = None
    cache_write: Table | None = None
    path: str = ""

    def same_shapes(self, model: ModelSpec) -> bool:
        return all(getattr(model, f) == getattr(self.model, f) for f in _SHAPE_FIELDS)

    def check_gpu(self, gpu_name: str) -> None:
        if gpu_name != self.gpu:
            raise InputError(f"measured on {self.gpu!r}, not on {{gpu}} {gpu_name!r}: pass {{gpu={self.gpu}}} or a "
                             "calibration of that GPU", source=self.path or None, field="gpu", value=self.gpu,
                             has_value=True)

    def describe(self, model: ModelSpec) -> str:
        covered = [name for name in TABLES if getattr(self, name) is not None]
        scaled = "" if self.same_shapes(model) else f", scaled from {self.model.name}'s shapes"
        return f"{Path(self.path).name or self.gpu} ({', '.join(covered)}{scaled})"

    def to_yaml(self, header: str = "") -> str:
        model = self.model
        shapes = {"name": model.name, "model_type": "llama" if model.gated_mlp else "opt",
                  **{hf: getattr(model, field) for field, hf in _HF_KEYS.items()}}
        body: dict[str, Any] = {"gpu": self.gpu, "model": shapes, "source": self.source}
        for name in TABLES:
            table = getattr(self, name)
            if table is not None:
                body[name] = table.to_dict()
        comments = "".join(f"# {line}\n" if line else "#\n" for line in header.splitlines())
        return comments + yaml.safe_dump(body, sort_keys=False, width=116, default_flow_style=None)


def load_calibration(path: str | Path) -> Calibration:
    source = str(path)
    data = read_mapping(Path(path), "with gpu, model, source and tables", field="{calibration}")
    known = {"gpu", "model", "source", *TABLES}
    unknown = sorted(set(data) - known)
    if unknown:
        raise InputError(f"unknown key; expected {sorted(known)}", source=source, field=unknown[0])
    for key in ("gpu", "model", "source", "linear"):
        if key not in data:
            raise InputError("missing", source=source, field=key)
    if not isinstance(data["model"], dict):
        raise InputError("expected the measured model's config keys", source=source, field="model",
                         value=data["model"], has_value=True)
    model_config = dict(data["model"])
    model = model_from_hf_config(model_config, name=str(model_config.pop("name", "calibrated")), source=source)
    return Calibration(
        gpu=str(data["gpu"]), model=model, source=str(data["source"]), path=source,
        linear=_table(data, "linear", source),
        elementwise=_table(data, "elementwise", source) if "elementwise" in data else None,
        prefill_attention=_table(data, "prefill_attention", source) if "prefill_attention" in data else None,
        decode_attention=_grid(data["decode_attention"], source) if "decode_attention" in data else None,
        cache_write=_table(data, "cache_write", source) if "cache_write" in data else None,
    )


def _increasing(values: Any, source: str, field: str) -> np.ndarray:
    if not isinstance(values, list) or not values:
        raise InputError("expected a non-empty list", source=source, field=field, value=values, has_value=True)
    array = np.asarray([token_count(v, source=source, field=f"{field}[{i}]")
                        for i, v in enumerate(values)], dtype=np.float64)
    bad = np.flatnonzero(np.diff(array) <= 0)
    if bad.size:
        raise InputError("must increase", source=source, field=f"{field}[{bad[0] + 1}]", value=values[bad[0] + 1],
                         has_value=True)
    return array


def _seconds(values: Any, count: int, source: str, field: str) -> np.ndarray:
    if not isinstance(values, list) or len(values) != count:
        raise InputError(f"expected a list of {count} times", source=source, field=field,
                         value=values if not isinstance(values, list) else f"{len(values)} values", has_value=True)
    return np.asarray([positive_number(v, source=source, field=f"{field}[{i}]") for i, v in enumerate(values)],
                      dtype=np.float64)


def _table(data: dict[str, Any], name: str, source: str) -> Table:
    table = data[name]
    if not isinstance(table, dict) or set(table) != {"tokens", "seconds"}:
        raise InputError("expected {tokens: [...], seconds: [...]}", source=source, field=name, value=table,
                         has_value=True)
    sizes = _increasing(table["tokens"], source, f"{name}.tokens")
    return Table(sizes, _seconds(table["seconds"], len(sizes), source, f"{name}.seconds"))


def _grid(table: Any, source: str) -> Grid:
    name = "decode_attention"
    if not isinstance(table, dict) or set(table) != {"batch", "context", "seconds"}:
        raise InputError("expected {batch: [...], context: [...], seconds: [[...], ...]}", source=source,
                         field=name, value=table, has_value=True)
    batch = _increasing(table["batch"], source, f"{name}.batch")
    context = _increasing(table["context"], source, f"{name}.context")
    rows = table["seconds"]
    if not isinstance(rows, list) or len(rows) != len(batch):
        raise InputError(f"expected {len(batch)} rows, one per batch size", source=source, field=f"{name}.seconds")
    seconds = np.stack([_seconds(row, len(context), source, f"{name}.seconds[{i}]") for i, row in enumerate(rows)])
    return Grid(batch, context, seconds)
