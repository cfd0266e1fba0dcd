"""Typed field access for the YAML formats (each error naming the file, the place, the field and the value) and
the seeded samplers of their ``generate`` forms: arrival processes, token counts, durations."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from minipaged_cli.errors import InputError, did_you_mean
from minipaged_cli.validation import MAX_REQUESTS, MAX_TOKENS, finite_number, token_count, whole_number

ARRIVAL_KEYS = {
    "poisson": {"rate_per_s"},
    "constant": {"rate_per_s"},
    "uniform": {"end_s"},
}
LENGTH_KEYS = {
    "constant": {"value"},
    "uniform": {"low", "high"},
    "lognormal": {"median", "sigma"},
    "normal": {"mean", "std"},
}


def poisson_arrivals(count: int, rate_per_s: float, rng: np.random.Generator, start_s: float = 0.0) -> np.ndarray:
    """Arrival times of a Poisson process: cumulative sums of exponential gaps with mean 1 / rate."""
    return start_s + np.cumsum(rng.exponential(1.0 / rate_per_s, size=count))


@dataclass(frozen=True)
class Group:
    """What every ``generate:`` group begins with: its ``count``, its seeded generator (``seed``) and the
    ``count`` arrival times drawn first from it (``arrival``), the ``id_prefix`` of what it makes."""

    reader: Fields
    where: str
    count: int
    rng: np.random.Generator
    arrivals: np.ndarray
    id_prefix: str


def read_group(group: dict[str, Any], index: int, source: str, keys: set[str], id_prefix: str) -> Group:
    where = f"generate[{index}]"
    reader = Fields(source, where)
    reader.check_keys(group, keys)
    count = reader.count(group, "count", minimum=1, maximum=MAX_REQUESTS)
    rng = np.random.default_rng(reader.count(group, "seed", minimum=0, default=0))
    prefix = str(group.get("id_prefix", f"{id_prefix}{index}-"))
    arrivals = sample_arrivals(reader.mapping(group, "arrival"), count, rng, Fields(source, f"{where}.arrival"))
    return Group(reader, where, count, rng, arrivals, prefix)


def sample_arrivals(spec: dict[str, Any], count: int, rng: np.random.Generator, reader: Fields) -> np.ndarray:
    process = reader.choice(spec, "process", sorted(ARRIVAL_KEYS))
    reader.check_keys(spec, {"process", "start_s"} | ARRIVAL_KEYS[process])
    start = reader.number(spec, "start_s", minimum=0.0, default=0.0)
    if process == "uniform":
        end = reader.number(spec, "end_s", minimum=start)
        return np.sort(rng.uniform(start, end, size=count))
    rate = reader.number(spec, "rate_per_s", minimum=0.0, exclusive=True)
    with np.errstate(over="ignore"):  # refused below, with the field named, instead of a warning
        arrivals = poisson_arrivals(count, rate, rng, start) if process == "poisson" else \
            start + np.arange(count) / rate
    if not np.isfinite(arrivals[-1]):  # a subnormal rate: 1 / rate overflows, and the replay would print nan
        raise reader.error("arrival times overflow to infinity; use a larger rate", "rate_per_s", rate)
    return arrivals


def sample_lengths(spec: dict[str, Any], count: int, rng: np.random.Generator, reader: Fields) -> np.ndarray:
    """Token counts from a distribution, rounded and clipped into [min, max] (min defaults to 1); without a max,
    a sampled count above ``MAX_TOKENS`` is refused rather than clipped to a bound nobody wrote."""
    dist = reader.choice(spec, "dist", sorted(LENGTH_KEYS))
    reader.check_keys(spec, {"dist", "min", "max"} | LENGTH_KEYS[dist])
    low_bound = reader.tokens(spec, "min", default=1)
    high_bound = reader.tokens(spec, "max", minimum=low_bound, default=None)
    if dist == "uniform":  # whole numbers, each as likely
        low = reader.tokens(spec, "low")
        high = reader.tokens(spec, "high", minimum=low)
        values = rng.integers(low, high, size=count, endpoint=True).astype(float)
    else:
        values = np.rint(_draw(dist, spec, count, rng, reader, reader.tokens))
    if high_bound is None and not values.max() <= MAX_TOKENS:  # (also NaN)
        raise reader.error(f"a sampled count exceeds {MAX_TOKENS} (2**31 - 1); give a max", "max", None,
                           has_value=False)
    return np.clip(values, low_bound, high_bound if high_bound is not None else MAX_TOKENS).astype(np.int64)


def sample_seconds(spec: dict[str, Any], count: int, rng: np.random.Generator, reader: Fields) -> np.ndarray:
    """Durations (think times, tool latencies) from a distribution, clipped into [min, max] (min defaults to 0)."""
    dist = reader.choice(spec, "dist", sorted(LENGTH_KEYS))
    reader.check_keys(spec, {"dist", "min", "max"} | LENGTH_KEYS[dist])
    low_bound = reader.number(spec, "min", minimum=0.0, default=0.0)
    high_bound = reader.number(spec, "max", minimum=low_bound, default=math.inf)
    if dist == "uniform":
        low = reader.number(spec, "low", minimum=0.0)
        values = rng.uniform(low, reader.number(spec, "high", minimum=low), size=count)
    else:
        values = _draw(dist, spec, count, rng, reader, functools.partial(reader.number, minimum=0.0))
    if not np.isfinite(values).all():
        raise reader.error("a sampled duration overflows; give smaller parameters", "dist", dist)
    return np.clip(values, low_bound, high_bound)


def _draw(dist: str, spec: dict[str, Any], count: int, rng: np.random.Generator, reader: Fields,
          value: Callable[[dict[str, Any], str], Any]) -> np.ndarray:
    """``count`` draws of a constant, lognormal or normal distribution (``value`` reads its constant)."""
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused by the caller, the field named
        if dist == "constant":
            return np.full(count, float(value(spec, "value")))
        if dist == "lognormal":
            median = reader.number(spec, "median", minimum=0.0, exclusive=True)
            sigma = reader.number(spec, "sigma", minimum=0.0)
            return rng.lognormal(math.log(median), sigma, size=count)
        mean = reader.number(spec, "mean", minimum=0.0)
        std = reader.number(spec, "std", minimum=0.0)
        return rng.normal(mean, std, size=count)


_REQUIRED = object()


class Fields:
    """Typed field access for one YAML mapping, raising ``InputError`` that names file, place and field."""

    def __init__(self, source: str, where: str | None) -> None:
        self.source = source
        self.where = where

    def error(self, message: str, key: str | None = None, value: Any = None, has_value: bool = True) -> InputError:
        return InputError(message, source=self.source, where=self.where, field=key, value=value,
                          has_value=has_value)

    def check_keys(self, mapping: dict[str, Any], allowed: set[str]) -> None:
        for key in mapping:
            if key not in allowed:
                raise self.error(f"unknown key{did_you_mean(str(key), allowed, cutoff=0.5)}; expected one of "
                                 f"{', '.join(sorted(allowed))}", str(key), has_value=False)

    def get(self, mapping: dict[str, Any], key: str) -> Any:
        if key not in mapping:
            raise self.error("missing", key, has_value=False)
        return mapping[key]

    def count(self, mapping: dict[str, Any], key: str, *, minimum: int, maximum: int | None = None,
              default: Any = _REQUIRED) -> Any:
        """A whole number (``600`` or ``600.0``; not ``-5``, ``12.5`` or ``"600"``)."""
        if key not in mapping and default is not _REQUIRED:
            return default
        return whole_number(self.get(mapping, key), field=key, source=self.source, where=self.where,
                            minimum=minimum, maximum=maximum)

    def tokens(self, mapping: dict[str, Any], key: str, *, minimum: int = 1, default: Any = _REQUIRED) -> Any:
        """A whole number of tokens, at most ``MAX_TOKENS``."""
        if key not in mapping and default is not _REQUIRED:
            return default
        return token_count(self.get(mapping, key), field=key, source=self.source, where=self.where,
                           minimum=minimum)

    def number(self, mapping: dict[str, Any], key: str, *, minimum: float, exclusive: bool = False,
               default: Any = _REQUIRED) -> Any:
        if key not in mapping and default is not _REQUIRED:
            return default
        return finite_number(self.get(mapping, key), field=key, source=self.source, where=self.where,
                             minimum=minimum, exclusive_minimum=exclusive)

    def mapping(self, mapping: dict[str, Any], key: str) -> dict[str, Any]:
        value = self.get(mapping, key)
        if not isinstance(value, dict):
            raise self.error("expected a mapping", key, value)
        return value

    def choice(self, mapping: dict[str, Any], key: str, options: list[str]) -> str:
        value = self.get(mapping, key)
        if value not in options:
            hint = did_you_mean(str(value), options, cutoff=0.5)
            raise self.error(f"expected one of {', '.join(options)}{hint}", key, value)
        return value

    def prefix(self, mapping: dict[str, Any]) -> tuple[str, ...]:
        value = mapping.get("prefix", [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error("expected a list of segment names", "prefix", value)
        return tuple(value)
