"""The benchmark tools' synthetic workloads, generated from their own config files (seeded, so a file gives one
trace):

- ``genai-perf``: genai-perf's session options, as a YAML/JSON mapping of option names or as the command line
  itself (``--num-sessions``, ``--session-turns-mean/-stddev``, ``--session-turn-delay-mean/-stddev`` in ms,
  ``--synthetic-input-tokens-mean/-stddev``, ``--output-tokens-mean/-stddev``, ``--num-prefix-prompts``,
  ``--prefix-prompt-length``, ``--random-seed``): every session starts at t = 0, each turn's input begins with one
  of the prefix prompts drawn at random, as genai-perf prepends them.
- ``inference-perf``: inference-perf's config YAML with ``data.type: shared_prefix`` (``num_groups`` x
  ``num_prompts_per_group`` prompts of a ``system_prompt_len`` system prompt and a ``question_len`` question,
  ``output_len`` out; the newer names ``num_unique_system_prompts`` and ``num_users_per_system_prompt`` too),
  sent at ``load.stages`` rates (``load.type`` constant or poisson). With ``enable_multi_turn_chat`` each prompt
  is a user whose requests extend one conversation (request i goes to user i mod users, as inference-perf
  assigns them); a user's next turn follows its previous answer after the schedule's gap between its requests.
- ``vllm-multi-turn``: vLLM's ``benchmarks/multi_turn`` generator JSON (``filetype: generate_conversations``):
  ``num_turns`` counts messages (rounded up to even, at least 2: user and assistant alternate), the first user
  message carries ``common_prefix_num_tokens`` (shared by every conversation) and ``prefix_num_tokens`` (its own);
  distributions ``constant``, ``uniform``, ``lognormal`` (``average``, scaled to it as vLLM does, or ``mean`` and
  ``sigma``), ``zipf``, ``poisson``, each with an optional ``max``. Conversations start at t = 0.
- ``prefix-repetition``: ``vllm bench serve --dataset-name prefix_repetition``'s options (a mapping or the command
  line): ``num_prefixes`` prefixes of ``prefix_len`` tokens, ``num_prompts`` prompts split evenly among them, each
  with its own ``suffix_len`` tokens, ``output_len`` out, shuffled; ``--request-rate`` (Poisson; inf: all at 0).

Text in the configs (file names, models, URLs) is ignored; tokens are what the tools would send.
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from minipaged_cli.errors import InputError
from minipaged_cli.input_files import parse_json, parse_yaml, read_mapping, read_text
from minipaged_cli.validation import MAX_REQUESTS, MAX_TOKENS, finite_number, number_from_text, whole_number
from minipaged_cli.workloads.fields import poisson_arrivals
from minipaged_cli.workloads.request import Request
from minipaged_cli.workloads.sessions import Session, Turn
from minipaged_cli.workloads.trace import Trace, make_trace


class _Options:
    """Named numbers of one config (option names with ``-`` or ``_``), errors naming the file and the option."""

    def __init__(self, values: dict[str, Any], source: str, where: str | None = None) -> None:
        self.values = {str(k).lstrip("-").replace("-", "_"): v for k, v in values.items()}
        self.source = source
        self.where = where

    def number(self, key: str, default: float | None = None, *, minimum: float = 0.0) -> float:
        if self.values.get(key) is None:
            if default is None:
                raise InputError("missing", source=self.source, where=self.where, field=key)
            return default
        return finite_number(number_from_text(self.values[key]), field=key, source=self.source, where=self.where,
                             minimum=minimum)

    def count(self, key: str, default: int | None = None, *, minimum: int = 0) -> int:
        if self.values.get(key) is None and default is not None:
            return default
        if self.values.get(key) is None:
            raise InputError("missing", source=self.source, where=self.where, field=key)
        return whole_number(number_from_text(self.values[key]), field=key, source=self.source, where=self.where,
                            minimum=minimum, maximum=MAX_REQUESTS)

    def mapping(self, key: str) -> _Options:
        value = self.values.get(key)
        if not isinstance(value, dict):
            raise InputError("expected a mapping", source=self.source, where=self.where, field=key, value=value,
                             has_value=True)
        return _Options(value, self.source, f"{self.where}.{key}" if self.where else key)


def _options(path: Path) -> _Options:
    """A mapping (YAML, JSON) or a command line (``genai-perf profile ... --num-sessions 8 ...``)."""
    text = read_text(path)
    first = next((line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")),
                 "")
    if first.startswith(("genai-perf", "vllm", "--", "python")):
        values: dict[str, Any] = {}
        try:
            words = shlex.split(text, comments=True)
        except ValueError as error:  # an unclosed quote
            raise InputError(f"not a command line: {error}", source=str(path)) from None
        for index, word in enumerate(words):
            if word.startswith("--"):
                name, _, value = word.partition("=")
                following = words[index + 1] if index + 1 < len(words) else ""
                values[name] = value or (following if following and not following.startswith("--") else True)
        return _Options(values, str(path))
    document = parse_json(text, str(path)) if path.suffix == ".json" else parse_yaml(text, str(path))
    if not isinstance(document, dict):
        raise InputError("expected a mapping of options, or the command line", source=str(path))
    return _Options(document, str(path))


def _normal(rng: np.random.Generator, mean: float, std: float, size: int, low: int) -> np.ndarray:
    """Whole numbers from a normal distribution (a constant when std is 0), at least ``low``, at most
    ``MAX_TOKENS`` (what a prompt may hold)."""
    values = rng.normal(mean, std, size) if std > 0 else np.full(size, mean)
    return np.clip(np.rint(values), low, MAX_TOKENS).astype(np.int64)


def _checked_total(total: int, options: _Options, key: str) -> int:
    """A number of requests a config makes, refused past ``MAX_REQUESTS`` before anything that size is built."""
    if total > MAX_REQUESTS:
        raise InputError(f"makes {total} requests, more than {MAX_REQUESTS}", source=options.source,
                         where=options.where, field=key, value=options.values.get(key), has_value=True)
    return total


def read_genai_perf(path: Path) -> Trace:
    options = _options(path)
    rng = np.random.default_rng(options.count("random_seed", 0))
    count = options.count("num_sessions", minimum=1)
    turns = _normal(rng, options.number("session_turns_mean", 1.0), options.number("session_turns_stddev", 0.0),
                    count, 1)
    _checked_total(int(turns.sum()), options, "session_turns_mean")
    num_prefixes = options.count("num_prefix_prompts", 0)
    prefix_length = options.count("prefix_prompt_length", 100, minimum=1)
    segments = {f"genai-perf-prefix-{k}": prefix_length for k in range(num_prefixes)}
    sessions = []
    for number, num_turns in enumerate(turns.tolist()):
        inputs = _normal(rng, options.number("synthetic_input_tokens_mean", 550.0),
                         options.number("synthetic_input_tokens_stddev", 0.0), num_turns, 1)
        outputs = _normal(rng, options.number("output_tokens_mean", minimum=1.0),
                          options.number("output_tokens_stddev", 0.0), num_turns, 1)
        delays = np.maximum(rng.normal(options.number("session_turn_delay_mean", 0.0),
                                       options.number("session_turn_delay_stddev", 0.0), num_turns), 0.0) / 1000.0
        prefixes = rng.integers(0, num_prefixes, num_turns) if num_prefixes else None
        sessions.append(Session(f"session-{number}", tuple(
            Turn(int(inputs[i]) + (prefix_length if prefixes is not None else 0), int(outputs[i]),
                 delay_s=float(delays[i]) if i else 0.0,
                 segments=(f"genai-perf-prefix-{prefixes[i]}",) if prefixes is not None else ())
            for i in range(num_turns))))
    return make_trace(path.stem, [], source=str(path), segments=segments, sessions=sessions,
                      description=f"genai-perf sessions from {path.name}")


def read_inference_perf(path: Path) -> Trace:
    source = str(path)
    config = _Options(read_mapping(path, "(the tool's config)"), source)
    data = config.mapping("data")
    if data.values.get("type") != "shared_prefix":
        raise InputError("expected shared_prefix (the generator minipaged reads)", source=source, where="data",
                         field="type", value=data.values.get("type"), has_value=True)
    shared = data.mapping("shared_prefix")
    rng = np.random.default_rng(0)  # (inference-perf shuffles unseeded; a trace is one draw of it)
    groups = shared.count("num_groups", shared.count("num_unique_system_prompts", 1), minimum=1)
    per_group = shared.count("num_prompts_per_group", shared.count("num_users_per_system_prompt", 1), minimum=1)
    system = shared.count("system_prompt_len", minimum=1)
    questions = _lengths(shared, "question_len", groups * per_group, rng)
    outputs = _lengths(shared, "output_len", groups * per_group, rng)
    prompts = [(g, questions[g * per_group + p], outputs[g * per_group + p]) for g in range(groups)
               for p in range(per_group)]
    rng.shuffle(prompts)  # type: ignore[arg-type]
    arrivals = _stage_arrivals(config.mapping("load"), rng)
    segments = {f"system-{g}": system for g in range(groups)}
    if not shared.values.get("enable_multi_turn_chat"):
        requests = [Request(f"inference-perf-{i}", float(t), system + int(prompts[i % len(prompts)][1]),
                            int(prompts[i % len(prompts)][2]), prefix=(f"system-{prompts[i % len(prompts)][0]}",))
                    for i, t in enumerate(arrivals)]
        return make_trace(path.stem, requests, source=source, segments=segments,
                          description=f"inference-perf shared_prefix from {path.name}")
    users = len(prompts)
    sessions = []
    for user, (group, question, output) in enumerate(prompts):
        times = arrivals[user::users]
        if not len(times):
            continue
        sessions.append(Session(f"user-{user}", tuple(
            Turn(int(question), int(output), delay_s=float(times[r] - times[r - 1]) if r else 0.0)
            for r in range(len(times))), start_s=float(times[0]), prefix=(f"system-{group}",)))
    return make_trace(path.stem, [], source=source, segments=segments, sessions=sessions,
                      description=f"inference-perf shared_prefix multi-turn chat from {path.name}")


def _lengths(options: _Options, key: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """inference-perf's lengths: ``key`` as the mean, ``key_std`` a normal spread, clipped to ``key_min/max``."""
    values = _normal(rng, options.number(key, minimum=1.0), options.number(f"{key}_std", 0.0), size, 1)
    return np.clip(values, options.count(f"{key}_min", 1), options.count(f"{key}_max", 2**31 - 1))


def _stage_arrivals(load: _Options, rng: np.random.Generator) -> np.ndarray:
    """Send times over the stages in turn: rate x duration requests each, evenly spaced or Poisson."""
    kind = load.values.get("type", "constant")
    if kind not in ("constant", "poisson"):
        raise InputError("expected constant or poisson", source=load.source, where=load.where, field="type",
                         value=kind, has_value=True)
    stages = load.values.get("stages")
    if not isinstance(stages, list) or not stages:
        raise InputError("expected a list of stages (rate, duration)", source=load.source, where=load.where,
                         field="stages", value=stages, has_value=True)
    times, start = [], 0.0
    for index, stage in enumerate(stages):
        options = _Options(stage if isinstance(stage, dict) else {}, load.source, f"load.stages[{index}]")
        rate, duration = options.number("rate", minimum=1e-9), options.number("duration", minimum=1e-9)
        count = _checked_total(max(1, round(rate * duration)), options, "rate")
        gaps = rng.exponential(1.0 / rate, count) if kind == "poisson" else np.full(count, 1.0 / rate)
        times.append(start + np.cumsum(gaps) - gaps[0])
        start += duration
    return np.concatenate(times)


def read_vllm_multi_turn(path: Path) -> Trace:
    source = str(path)
    config = _Options(read_mapping(path, "(the tool's config)"), source)
    if config.values.get("filetype") != "generate_conversations":
        raise InputError("expected generate_conversations", source=source, field="filetype",
                         value=config.values.get("filetype"), has_value=True)
    rng = np.random.default_rng(0)
    count = config.count("num_conversations", minimum=1)
    inputs, outputs = config.mapping("prompt_input"), config.mapping("prompt_output")
    messages = _vllm_draw(inputs, "num_turns", count, rng)
    messages = np.clip(messages, 2, 2 * MAX_REQUESTS)
    messages += messages % 2
    _checked_total(int(messages.sum()) // 2, inputs, "num_turns")
    common = int(_vllm_draw(inputs, "common_prefix_num_tokens", 1, rng)[0]) if "common_prefix_num_tokens" \
        in inputs.values else 0
    prefixes = _vllm_draw(inputs, "prefix_num_tokens", count, rng)
    segments = {"common-prefix": common} if common else {}
    sessions = []
    for number in range(count):
        num_turns = int(messages[number]) // 2
        asked = np.maximum(_vllm_draw(inputs, "num_tokens", num_turns, rng), 1)
        answered = np.maximum(_vllm_draw(outputs, "num_tokens", num_turns, rng), 1)
        first = common + int(prefixes[number])
        sessions.append(Session(f"conv-{number}", tuple(
            Turn(int(asked[i]) + (first if i == 0 else 0), int(answered[i]),
                 segments=("common-prefix",) if common and i == 0 else ()) for i in range(num_turns))))
    return make_trace(path.stem, [], source=source, segments=segments, sessions=sessions,
                      description=f"vLLM multi-turn benchmark conversations from {path.name}")


def _vllm_draw(section: _Options, key: str, size: int, rng: np.random.Generator) -> np.ndarray:
    """Whole numbers from one of the generator's distributions."""
    spec = section.mapping(key)
    kind = spec.values.get("distribution")
    draws: dict[str, Callable[[], np.ndarray]] = {
        "constant": lambda: np.full(size, spec.number("value")),
        "uniform": lambda: rng.integers(spec.count("min"), spec.count("max", minimum=spec.count("min")) + 1,
                                        size).astype(float),
        "zipf": lambda: rng.zipf(spec.number("alpha", minimum=1.0 + 1e-9), size).astype(float),
        "poisson": lambda: rng.poisson(spec.number("alpha"), size).astype(float),
        "lognormal": lambda: _vllm_lognormal(spec, size, rng),
    }
    if kind not in draws:
        raise InputError(f"expected one of {', '.join(draws)}", source=spec.source, where=spec.where,
                         field="distribution", value=kind, has_value=True)
    values = draws[kind]()
    if spec.values.get("max") is not None:
        values = np.minimum(values, spec.number("max"))
    return np.clip(np.rint(values), 0, MAX_TOKENS).astype(np.int64)


def _vllm_lognormal(spec: _Options, size: int, rng: np.random.Generator) -> np.ndarray:
    """vLLM's: by ``average`` (median 0.85 x average, draws scaled so their mean is the average) or by
    ``mean`` and ``sigma`` of the underlying normal."""
    if spec.values.get("average") is None:
        return rng.lognormal(spec.number("mean"), spec.number("sigma"), size)
    average = spec.number("average", minimum=1.0)
    ratio = spec.number("median_ratio", 0.85, minimum=1e-9)
    values = rng.lognormal(math.log(average * ratio), math.sqrt(2 * math.log(1 / ratio)), size)
    return values * average / values.mean()


def read_prefix_repetition(path: Path) -> Trace:
    options = _options(path)
    prefix = "prefix_repetition_" if any(k.startswith("prefix_repetition_") for k in options.values) else ""
    prefix_len = options.count(f"{prefix}prefix_len", 256, minimum=1)
    suffix_len = options.count(f"{prefix}suffix_len", 256, minimum=1)
    num_prefixes = options.count(f"{prefix}num_prefixes", 10, minimum=1)
    output_len = options.count(f"{prefix}output_len", 128, minimum=1)
    num_prompts = options.count("num_prompts", 1000, minimum=num_prefixes)
    rng = np.random.default_rng(options.count("seed", 0))
    rate = options.values.get("request_rate", "inf")
    per_prefix = num_prompts // num_prefixes
    order = rng.permutation(per_prefix * num_prefixes)
    times = np.zeros(len(order)) if str(rate) == "inf" else \
        poisson_arrivals(len(order), options.number("request_rate", minimum=1e-9), rng)
    requests = [Request(f"prefix-rep-{i}", float(times[i]), prefix_len + suffix_len, output_len,
                        prefix=(f"prefix-{int(order[i]) // per_prefix}",)) for i in range(len(order))]
    return make_trace(path.stem, requests, source=str(path),
                      segments={f"prefix-{p}": prefix_len for p in range(num_prefixes)},
                      description=f"vllm bench prefix_repetition from {path.name}")


BENCHMARK_CONFIGS: dict[str, Callable[[Path], Trace]] = {
    "genai-perf": read_genai_perf,
    "inference-perf": read_inference_perf,
    "vllm-multi-turn": read_vllm_multi_turn,
    "prefix-repetition": read_prefix_repetition,
}
