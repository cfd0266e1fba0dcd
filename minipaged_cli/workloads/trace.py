"""Request traces: the YAML workload format, its validation, and seeded synthetic request groups.

A trace is a list of requests, each arriving at ``arrival_s`` with ``prompt_tokens`` to prefill and
``output_tokens`` to generate, optionally starting with named shared prompt segments (``prefix``). See
README.md's "Traces" section for the format; ``readers.py`` reads the public CSV/JSONL traces into the same form.

(Over 300 lines on purpose: the YAML schema is validated field by field, each error naming the file, the request,
the field and the value; the checks are the bulk of it and belong with the format they check.)
"""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from minipaged_cli.errors import InputError, did_you_mean
from minipaged_cli.input_files import read_yaml
from minipaged_cli.validation import MAX_REQUESTS, MAX_TOKENS, finite_number, token_count, whole_number


@dataclass(frozen=True)
class Request:
    """One request: arrives, prefills ``prompt_tokens``, then generates ``output_tokens`` one step at a time.

    ``n`` > 1 is parallel sampling: after the prefill, ``n`` sequences each generate ``output_tokens``, forked
    from the one prompt (its blocks shared until written).
    """

    id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix: tuple[str, ...] = ()
    n: int = 1

    @property
    def total_tokens(self) -> int:
        """prompt + output: what ``--max-model-len`` bounds and what an exact reservation holds."""
        return self.prompt_tokens + self.output_tokens


@dataclass(frozen=True)
class Trace:
    """A workload: requests sorted by arrival time, and the token counts of their shared prefix segments."""

    name: str
    requests: tuple[Request, ...]
    segments: dict[str, int] = field(default_factory=dict)
    description: str = ""

    @property
    def num_requests(self) -> int:
        return len(self.requests)

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.requests)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests)

    def limited(self, limit: int | None) -> Trace:
        """The first ``limit`` requests by arrival, and only the segments they use."""
        if limit is None or limit >= len(self.requests):
            return self
        requests = self.requests[:limit]
        used = {segment for request in requests for segment in request.prefix}
        segments = {name: tokens for name, tokens in self.segments.items() if name in used}
        return replace(self, requests=requests, segments=segments)

    def time_scaled(self, time_scale: float) -> Trace:
        """Every arrival time multiplied by ``time_scale`` (< 1 compresses the trace: a higher request rate)."""
        if time_scale == 1.0:
            return self
        return replace(self, requests=tuple(replace(r, arrival_s=r.arrival_s * time_scale) for r in self.requests))

    def with_poisson_arrivals(self, rate_per_s: float, seed: int) -> Trace:
        """Arrival times replaced by a seeded Poisson process of ``rate_per_s`` (order kept)."""
        times = poisson_arrivals(len(self.requests), rate_per_s, np.random.default_rng(seed))
        requests = tuple(replace(r, arrival_s=float(t)) for r, t in zip(self.requests, times, strict=True))
        return replace(self, requests=requests)


def poisson_arrivals(count: int, rate_per_s: float, rng: np.random.Generator, start_s: float = 0.0) -> np.ndarray:
    """Arrival times of a Poisson process: cumulative sums of exponential gaps with mean 1 / rate."""
    return start_s + np.cumsum(rng.exponential(1.0 / rate_per_s, size=count))


def make_trace(
    name: str,
    requests: list[Request],
    *,
    source: str,
    segments: dict[str, int] | None = None,
    description: str = "",
) -> Trace:
    """Sort by arrival (stably) and check what holds across requests: unique ids, known segments."""
    if not requests:
        raise InputError("the trace has no requests", source=source)
    seen: set[str] = set()
    segments = segments or {}
    for index, request in enumerate(requests):
        where = f"requests[{index}] (id {request.id})"
        if request.id in seen:
            raise InputError("duplicate request id", source=source, where=where, field="id",
                             value=request.id, has_value=True)
        seen.add(request.id)
        prefix_tokens = 0
        for segment in request.prefix:
            if segment not in segments:
                raise InputError(f"unknown segment{did_you_mean(segment, segments, cutoff=0.5)}; define it under "
                                 "'segments'", source=source, where=where, field="prefix",
                                 value=segment, has_value=True)
            prefix_tokens += segments[segment]
        if prefix_tokens > request.prompt_tokens:
            raise InputError(f"prefix segments hold {prefix_tokens} tokens, more than the prompt's "
                             f"{request.prompt_tokens}", source=source, where=where, field="prefix",
                             value=list(request.prefix), has_value=True)
    ordered = sorted(requests, key=lambda r: r.arrival_s)
    return Trace(name=name, requests=tuple(ordered), segments=dict(segments), description=description)


# -- the YAML format ---------------------------------------------------------------------------------------

_TOP_KEYS = {"version", "name", "description", "requests", "generate", "segments"}
_REQUEST_KEYS = {"id", "arrival_s", "prompt_tokens", "output_tokens", "prefix", "n"}
_GROUP_KEYS = {"count", "seed", "arrival", "prompt_tokens", "output_tokens", "id_prefix", "prefix", "n"}
_ARRIVAL_KEYS = {
    "poisson": {"rate_per_s"},
    "constant": {"rate_per_s"},
    "uniform": {"end_s"},
}
_LENGTH_KEYS = {
    "constant": {"value"},
    "uniform": {"low", "high"},
    "lognormal": {"median", "sigma"},
    "normal": {"mean", "std"},
}


def load_yaml_trace(path: Path) -> Trace:
    """Read and validate a YAML trace (the safe loader, duplicate keys refused); every problem is an
    ``InputError`` naming the field."""
    source = str(path)
    document = read_yaml(path)
    if not isinstance(document, dict):
        raise InputError("expected a mapping with a 'requests' or 'generate' list", source=source)
    reader = _Fields(source, None)
    reader.check_keys(document, _TOP_KEYS)
    version = document.get("version", 1)
    if version != 1:
        raise InputError("only version 1 exists", source=source, field="version", value=version, has_value=True)
    segments = _read_segments(document.get("segments") or {}, source)

    requests: list[Request] = []
    explicit = document.get("requests") or []
    if not isinstance(explicit, list):
        raise InputError("expected a list", source=source, field="requests", value=explicit, has_value=True)
    for index, entry in enumerate(explicit):
        requests.append(_read_request(entry, index, source))
    groups = document.get("generate") or []
    if not isinstance(groups, list):
        raise InputError("expected a list", source=source, field="generate", value=groups, has_value=True)
    for index, group in enumerate(groups):
        requests.extend(_generate_group(group, index, source))
    name = document.get("name") or path.stem
    description = document.get("description") or ""
    return make_trace(str(name), requests, source=source, segments=segments, description=str(description))


def _read_segments(raw: Any, source: str) -> dict[str, int]:
    if not isinstance(raw, dict):
        raise InputError("expected a mapping of segment name to token count", source=source,
                         field="segments", value=raw, has_value=True)
    reader = _Fields(source, "segments")
    return {str(name): reader.tokens(raw, name) for name in raw}


def _read_request(entry: Any, index: int, source: str) -> Request:
    request_id = entry.get("id") if isinstance(entry, dict) else None
    where = f"requests[{index}]" + (f" (id {request_id})" if request_id is not None else "")
    if not isinstance(entry, dict):
        raise InputError("expected a mapping", source=source, where=where, value=entry, has_value=True)
    reader = _Fields(source, where)
    reader.check_keys(entry, _REQUEST_KEYS)
    if "id" not in entry:
        raise InputError("missing", source=source, where=where, field="id")
    if not isinstance(request_id, str | int) or isinstance(request_id, bool):
        raise InputError("must be a string or an integer", source=source, where=where, field="id",
                         value=request_id, has_value=True)
    return Request(
        id=str(request_id),
        arrival_s=reader.number(entry, "arrival_s", minimum=0.0),
        prompt_tokens=reader.tokens(entry, "prompt_tokens"),
        output_tokens=reader.tokens(entry, "output_tokens"),
        prefix=reader.prefix(entry),
        n=reader.count(entry, "n", minimum=1, maximum=MAX_REQUESTS, default=1),
    )


def _generate_group(group: Any, index: int, source: str) -> list[Request]:
    where = f"generate[{index}]"
    if not isinstance(group, dict):
        raise InputError("expected a mapping", source=source, where=where, value=group, has_value=True)
    reader = _Fields(source, where)
    reader.check_keys(group, _GROUP_KEYS)
    count = reader.count(group, "count", minimum=1, maximum=MAX_REQUESTS)
    seed = reader.count(group, "seed", minimum=0, default=0)
    id_prefix = str(group.get("id_prefix", f"gen{index}-"))
    rng = np.random.default_rng(seed)
    arrivals = _sample_arrivals(reader.mapping(group, "arrival"), count, rng, _Fields(source, f"{where}.arrival"))
    prompts = _sample_lengths(reader.mapping(group, "prompt_tokens"), count, rng,
                              _Fields(source, f"{where}.prompt_tokens"))
    outputs = _sample_lengths(reader.mapping(group, "output_tokens"), count, rng,
                              _Fields(source, f"{where}.output_tokens"))
    prefix = reader.prefix(group)
    n = reader.count(group, "n", minimum=1, maximum=MAX_REQUESTS, default=1)
    return [
        Request(f"{id_prefix}{i}", float(arrivals[i]), int(prompts[i]), int(outputs[i]), prefix, n)
        for i in range(count)
    ]


def _sample_arrivals(spec: dict[str, Any], count: int, rng: np.random.Generator, reader: _Fields) -> np.ndarray:
    process = reader.choice(spec, "process", sorted(_ARRIVAL_KEYS))
    reader.check_keys(spec, {"process", "start_s"} | _ARRIVAL_KEYS[process])
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


def _sample_lengths(spec: dict[str, Any], count: int, rng: np.random.Generator, reader: _Fields) -> np.ndarray:
    """Token counts from a distribution, rounded and clipped into [min, max] (min defaults to 1); without a max,
    a sampled count above ``MAX_TOKENS`` is refused rather than clipped to a bound nobody wrote."""
    dist = reader.choice(spec, "dist", sorted(_LENGTH_KEYS))
    reader.check_keys(spec, {"dist", "min", "max"} | _LENGTH_KEYS[dist])
    low_bound = reader.tokens(spec, "min", default=1)
    high_bound = reader.tokens(spec, "max", minimum=low_bound, default=None)
    with np.errstate(over="ignore", invalid="ignore"):  # an overflow is refused below, with the field named
        if dist == "constant":
            values = np.full(count, float(reader.tokens(spec, "value")))
        elif dist == "uniform":
            low = reader.tokens(spec, "low")
            high = reader.tokens(spec, "high", minimum=low)
            values = rng.integers(low, high, size=count, endpoint=True).astype(float)
        elif dist == "lognormal":
            median = reader.number(spec, "median", minimum=0.0, exclusive=True)
            sigma = reader.number(spec, "sigma", minimum=0.0)
            values = rng.lognormal(math.log(median), sigma, size=count)
        else:
            mean = reader.number(spec, "mean", minimum=0.0)
            std = reader.number(spec, "std", minimum=0.0)
            values = rng.normal(mean, std, size=count)
        values = np.rint(values)
    if high_bound is None and not values.max() <= MAX_TOKENS:  # (also NaN)
        raise reader.error(f"a sampled count exceeds {MAX_TOKENS} (2**31 - 1); give a max", "max", None,
                           has_value=False)
    return np.clip(values, low_bound, high_bound if high_bound is not None else MAX_TOKENS).astype(np.int64)


_REQUIRED = object()


class _Fields:
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

    def _get(self, mapping: dict[str, Any], key: str) -> Any:
        if key not in mapping:
            raise self.error("missing", key, has_value=False)
        return mapping[key]

    def count(self, mapping: dict[str, Any], key: str, *, minimum: int, maximum: int | None = None,
              default: Any = _REQUIRED) -> Any:
        """A whole number (``600`` or ``600.0``; not ``-5``, ``12.5`` or ``"600"``)."""
        if key not in mapping and default is not _REQUIRED:
            return default
        return whole_number(self._get(mapping, key), field=key, source=self.source, where=self.where,
                            minimum=minimum, maximum=maximum)

    def tokens(self, mapping: dict[str, Any], key: str, *, minimum: int = 1, default: Any = _REQUIRED) -> Any:
        """A whole number of tokens, at most ``MAX_TOKENS``."""
        if key not in mapping and default is not _REQUIRED:
            return default
        return token_count(self._get(mapping, key), field=key, source=self.source, where=self.where,
                           minimum=minimum)

    def number(self, mapping: dict[str, Any], key: str, *, minimum: float, exclusive: bool = False,
               default: Any = _REQUIRED) -> Any:
        if key not in mapping and default is not _REQUIRED:
            return default
        return finite_number(self._get(mapping, key), field=key, source=self.source, where=self.where,
                             minimum=minimum, exclusive_minimum=exclusive)

    def mapping(self, mapping: dict[str, Any], key: str) -> dict[str, Any]:
        value = self._get(mapping, key)
        if not isinstance(value, dict):
            raise self.error("expected a mapping", key, value)
        return value

    def choice(self, mapping: dict[str, Any], key: str, options: list[str]) -> str:
        value = self._get(mapping, key)
        if value not in options:
            hint = did_you_mean(str(value), options, cutoff=0.5)
            raise self.error(f"expected one of {', '.join(options)}{hint}", key, value)
        return value

    def prefix(self, mapping: dict[str, Any]) -> tuple[str, ...]:
        value = mapping.get("prefix", [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error("expected a list of segment names", "prefix", value)
        return tuple(value)



def dump_trace(trace: Trace, *, header: str = "") -> str:
    """The trace as YAML in the format ``load_yaml_trace`` reads: explicit requests, one per line."""
    document: dict[str, Any] = {"version": 1, "name": trace.name}
    if trace.description:
        document["description"] = trace.description
    if trace.segments:
        document["segments"] = dict(trace.segments)
    lines = [f"# {line}" if line else "#" for text in header.splitlines() for line in textwrap.wrap(text, 110)]
    lines.append(yaml.safe_dump(document, sort_keys=False, width=120).rstrip())
    lines.append("requests:")
    for r in trace.requests:
        entry = {"id": r.id, "arrival_s": round(r.arrival_s, 6), "prompt_tokens": r.prompt_tokens,
                 "output_tokens": r.output_tokens, **({"prefix": list(r.prefix)} if r.prefix else {}),
                 **({"n": r.n} if r.n > 1 else {})}
        lines.append("  - " + yaml.safe_dump(entry, default_flow_style=True, sort_keys=False, width=10**6).strip())
    return "\n".join(lines) + "\n"
