"""Reading a trace in any supported format (``load_trace``): the YAML format of ``trace.py``, and readers for
public production traces into the same ``Trace``.

- ``azure``: Azure LLM inference trace 2023 (Splitwise), CSV ``TIMESTAMP,ContextTokens,GeneratedTokens``.
- ``mooncake``: Mooncake FAST'25 JSONL, ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``
  (one id per 512-token prompt block; equal ids mean equal content). Every full block becomes a shared prefix
  segment ``h<id>`` of 512 tokens, a partial last block of n tokens the segment ``h<id>:<n>`` (in the released
  traces a partial block's id never appears at another length nor as a full block; a request repeating a prompt
  finds the partial block's full KV blocks cached, as LMCache's simulator finds its complete 256-token halves).
  Rows with a ``session_id`` (AIPerf's and Dynamo's agent traces) are the turns of sessions (``read_mooncake``).
- ``lengths-csv``: length-only CSVs (ShareGPT via sarathi-serve: ``num_prefill_tokens,num_decode_tokens,...``;
  also ``prompt_tokens,output_tokens`` or ``input_length,output_length``); arrivals come from ``--rate``.
- ``aiperf`` (``aiperf.py``): AIPerf's single-turn and multi-turn JSONL; ``sharegpt`` (``sharegpt.py``): ShareGPT
  conversations, each a session; ``genai-perf``, ``inference-perf``, ``vllm-multi-turn``, ``prefix-repetition``
  (``bench_configs.py``): the benchmark tools' synthetic workloads, generated from their config files.
"""

from __future__ import annotations

import csv
import functools
import math
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from minipaged_cli.errors import InputError
from minipaged_cli.input_files import parse_json, read_json_lines
from minipaged_cli.validation import finite_number, number_from_text, positive_number, token_count, whole_number
from minipaged_cli.workloads.formats import TRACE_FORMATS
from minipaged_cli.workloads.sessions import Turn, sessions_of
from minipaged_cli.workloads.text_tokens import TextTokens
from minipaged_cli.workloads.trace import Request, Trace, load_yaml_trace, make_trace

MOONCAKE_BLOCK_TOKENS = 512
_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_LENGTH_COLUMNS = (
    ("num_prefill_tokens", "num_decode_tokens"),
    ("prompt_tokens", "output_tokens"),
    ("input_length", "output_length"),
)


def detect_format(path: Path) -> str:
    """By extension, then by the CSV header, a JSONL file's first row, or the head of a benchmark tool's config."""
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml", ".json", ".txt"):
        return _config_format(path)
    if suffix == ".jsonl":
        return _jsonl_format(path)
    if suffix == ".csv":
        header = _csv_header(path)
        if set(_AZURE_COLUMNS) <= set(header):
            return "azure"
        if _length_columns(header) is not None:
            return "lengths-csv"
        raise InputError(f"unrecognised CSV header {','.join(header)}; pass {{trace_format}}", source=str(path))
    raise InputError("cannot tell the format from the extension (.yaml, .json, .jsonl, .csv, .txt); pass "
                     "{trace_format}", source=str(path))


# A benchmark tool's config, told by its keys (or its command line's options) in its first 64 KB, comments left
# out (a trace in minipaged's YAML may be long; these are short). A minipaged YAML trace has none of these keys.
_CONFIG_SIGNS = (
    ("vllm-multi-turn", re.compile(r'"filetype"\s*:\s*"generate_conversations"')),
    ("inference-perf", re.compile(r"^data:(.|\n)*^\s+type:\s*shared_prefix\b", re.MULTILINE)),
    ("prefix-repetition", re.compile(r"^\s*(dataset[-_]name\s*:\s*prefix_repetition|prefix[-_]repetition[-_]\w+\s*:)"
                                     r"|\s--(dataset-name[ =]prefix_repetition|prefix-repetition-\w+)", re.MULTILINE)),
    ("genai-perf", re.compile(r"^\s*num[-_]sessions\s*:|\s--num-sessions\b", re.MULTILINE)),
)


def _config_format(path: Path) -> str:
    """ShareGPT (a JSON list), a benchmark tool's config by its keys, else minipaged's YAML."""
    with _open(path) as handle:
        head = "\n".join(line for line in handle.read(1 << 16).splitlines() if not line.lstrip().startswith("#"))
    if path.suffix.lower() == ".json" and head.lstrip().startswith("["):
        return "sharegpt"
    detected = next((name for name, sign in _CONFIG_SIGNS if sign.search(head)), None)
    if detected is None and path.suffix.lower() in (".json", ".txt"):
        raise InputError("cannot tell which format this is; pass {trace_format}", source=str(path))
    return detected or "yaml"


def _jsonl_format(path: Path) -> str:
    """AIPerf's rows (``turns``, ``text``, ``texts``) or Mooncake's (``input_length``), by the first row's keys."""
    with _open(path) as handle:
        first = next((line for line in handle if line.strip()), "")
    row = parse_json(first, str(path), "line 1") if first else {}
    return "aiperf" if isinstance(row, dict) and {"turns", "text", "texts"} & set(row) else "mooncake"


def read_azure(path: Path) -> Trace:
    """Arrivals count from the earliest TIMESTAMP, whatever the row order (``make_trace`` sorts the requests)."""
    source = str(path)
    rows = []
    with _open(path) as handle:
        reader = csv.DictReader(handle)
        _require_columns(reader.fieldnames or [], _AZURE_COLUMNS, source)
        for line, row in enumerate(reader, start=2):
            where = f"line {line}"
            rows.append((
                _azure_time(row["TIMESTAMP"], source, where),
                _token_count(row["ContextTokens"], source, where, "ContextTokens"),
                _token_count(row["GeneratedTokens"], source, where, "GeneratedTokens"),
            ))
    start = min((stamp for stamp, _, _ in rows), default=None)
    requests = [
        Request.plain(f"azure-{index}", (stamp - start).total_seconds(), prompt, output)
        for index, (stamp, prompt, output) in enumerate(rows)
    ]
    return make_trace(path.stem, requests, source=source,
                      description="Azure LLM inference trace 2023 (Azure/AzurePublicDataset, CC-BY-4.0)")


def read_mooncake(path: Path) -> Trace:
    """Rows with a ``session_id`` are the turns of that session, in file order (AIPerf's and Dynamo's agent
    traces): each row's ``input_length`` and ``hash_ids`` are its whole prompt (the history is in its hash ids, so
    no history is prepended), ``delay`` (ms) the wait after the previous turn's answer, the first row's
    ``timestamp`` the session's start. Rows without one are requests at their ``timestamp`` as before."""
    source = str(path)
    requests = []
    segments: dict[str, int] = {}
    sessions: dict[str, list[tuple[float | None, Turn]]] = {}
    for where, row in read_json_lines(path):
        session = row.get("session_id")
        required = ("input_length", "output_length") if session is not None else \
            ("timestamp", "input_length", "output_length")
        for key in required:
            if row.get(key) is None:
                raise InputError("missing", source=source, where=where, field=key)
        prompt = _token_count(row["input_length"], source, where, "input_length")
        output = _token_count(row["output_length"], source, where, "output_length")
        prefix = _mooncake_blocks(prompt, row.get("hash_ids", []), segments, source, where)
        if session is not None:
            start = _milliseconds(row, "timestamp", source, where)
            delay = _milliseconds(row, "delay", source, where) or 0.0
            sessions.setdefault(str(session), []).append(
                (start, Turn(prompt, output, delay_s=delay, segments=prefix, whole_prompt=True)))
            continue
        arrival_s = _milliseconds(row, "timestamp", source, where) or 0.0
        requests.append(Request.plain(f"mooncake-{len(requests)}", arrival_s, prompt, output, prefix))
    return make_trace(path.stem, requests, source=source, segments=segments, sessions=sessions_of(sessions),
                      description="Mooncake FAST'25 trace (kvcache-ai/Mooncake, Apache-2.0)")


def _mooncake_blocks(prompt: int, hash_ids: Any, segments: dict[str, int], source: str, where: str) -> tuple[str, ...]:
    """The prompt's 512-token blocks as shared segments (``segments`` gains them, in order): ``h<id>`` a whole
    block, ``h<id>:<tokens>`` the prompt's shorter last one; hash ids past the prompt's blocks name nothing. (The
    whole blocks in one pass: a trace holds hundreds of thousands.)"""
    if not isinstance(hash_ids, list):
        raise InputError("expected a list", source=source, where=where, field="hash_ids", value=hash_ids,
                         has_value=True)
    num_whole = prompt // MOONCAKE_BLOCK_TOKENS
    prefix = []
    for block_id in hash_ids[:num_whole]:
        name = f"h{block_id}"
        segments[name] = MOONCAKE_BLOCK_TOKENS
        prefix.append(name)
    last_tokens = prompt - num_whole * MOONCAKE_BLOCK_TOKENS
    if last_tokens and len(hash_ids) > num_whole:
        name = f"h{hash_ids[num_whole]}:{last_tokens}"
        segments[name] = last_tokens
        prefix.append(name)
    return tuple(prefix)


def _milliseconds(row: dict[str, Any], key: str, source: str, where: str) -> float | None:
    """A time in milliseconds, in seconds; None where the row has none."""
    value = row.get(key)
    if value is None:
        return None
    if (type(value) is int or type(value) is float) and 0 <= value <= sys.float_info.max:  # (every time: no call)
        return value / 1000.0
    return finite_number(value, field=key, source=source, where=where, minimum=0.0) / 1000.0


def read_lengths_csv(path: Path) -> Trace:
    """Prompt and output lengths only; every request arrives at t = 0 (``load_trace(rate=...)`` re-times them)."""
    source = str(path)
    requests = []
    with _open(path) as handle:
        reader = csv.DictReader(handle)
        columns = _length_columns(reader.fieldnames or [])
        if columns is None:
            raise InputError(f"expected columns {' or '.join(','.join(c) for c in _LENGTH_COLUMNS)}",
                             source=source, where="line 1")
        prompt_column, output_column = columns
        for line, row in enumerate(reader, start=2):
            where = f"line {line}"
            requests.append(Request(
                id=f"{path.stem}-{line - 2}",
                arrival_s=0.0,
                prompt_tokens=_token_count(row[prompt_column], source, where, prompt_column),
                output_tokens=_token_count(row[output_column], source, where, output_column),
            ))
    return make_trace(path.stem, requests, source=source, description=f"lengths from {path.name}")


@contextmanager
def _open(path: Path) -> Iterator[TextIO]:
    """The file as UTF-8 text; what goes wrong reading it, in the ``with`` block too, is bad input naming it."""
    try:
        with path.open(newline="", encoding="utf-8") as handle:
            yield handle
    except OSError as error:
        raise InputError(f"cannot read: {error.strerror}", source=str(path)) from None
    except UnicodeDecodeError as error:
        raise InputError(f"cannot read: {error}", source=str(path)) from None
    except csv.Error as error:  # a cell past csv's field size limit, a NUL byte
        raise InputError(f"not valid CSV: {error}", source=str(path)) from None


def _csv_header(path: Path) -> list[str]:
    with _open(path) as handle:
        return next(csv.reader(handle), [])


def _length_columns(header: list[str]) -> tuple[str, str] | None:
    return next((pair for pair in _LENGTH_COLUMNS if set(pair) <= set(header)), None)


def _require_columns(header: list[str], columns: tuple[str, ...], source: str) -> None:
    missing = [c for c in columns if c not in header]
    if missing:
        raise InputError(f"missing column {missing[0]!r}; expected {','.join(columns)}", source=source,
                         where="line 1")


def _azure_time(text: str, source: str, where: str) -> datetime:
    # The trace writes 7 fractional digits (100 ns); datetime's %f takes at most 6.
    try:
        date, _, fraction = (text or "").strip().partition(".")
        return datetime.strptime(f"{date}.{(fraction or '0')[:6]}", "%Y-%m-%d %H:%M:%S.%f")
    except ValueError:
        raise InputError("expected a time like 2023-11-16 18:15:46.6805900", source=source, where=where,
                         field="TIMESTAMP", value=text, has_value=True) from None


def _token_count(value: Any, source: str, where: str, field: str) -> int:
    """A CSV cell (text) or a JSON value: a whole number of tokens, 1 to ``MAX_TOKENS``."""
    if type(value) is not int:  # (a JSON trace's lengths are ints: token_count's own fast path takes them)
        value = number_from_text(value)
    return token_count(value, field=field, source=source, where=where)


def load_trace(
    path: str | Path,
    trace_format: str = "auto",
    *,
    rate: float | None = None,
    seed: int = 0,
    limit: int | None = None,
    time_scale: float = 1.0,
    tokenizer: Path | None = None,
) -> Trace:
    """Read a trace in any supported format, then apply ``limit``, ``rate`` (Poisson re-timing) and ``time_scale``.

    ``tokenizer``: a local tokenizer directory that counts the tokens of formats holding text (else estimated).
    ``rate`` replaces the arrival times with a seeded Poisson process (length-only CSVs have none: without a
    rate all their requests arrive at t = 0, like an offline benchmark).
    """
    path = Path(path)
    if trace_format not in TRACE_FORMATS:
        raise InputError(f"expected one of {', '.join(TRACE_FORMATS)}", field="{trace_format}", value=trace_format,
                         has_value=True)
    # The options first: a mistake in one is reported before a large trace is read.
    if limit is not None:
        limit = whole_number(limit, field="{limit}", minimum=1)
    if rate is not None:
        rate = positive_number(rate, field="{rate}")
    seed = whole_number(seed, field="{seed}", minimum=0)  # numpy's generators take no negative seed
    time_scale = positive_number(time_scale, field="{time_scale}")
    if path.is_dir():
        raise InputError("is a directory; expected a trace file", source=str(path))
    if not path.is_file():
        raise InputError("no such file", source=str(path))
    text_tokens = TextTokens(tokenizer)  # (a bad directory is reported before the trace is read)
    if trace_format == "auto":
        trace_format = detect_format(path)
    trace = _reader(trace_format, text_tokens)(path).limited(limit)
    if rate is not None:
        trace = _finite_arrivals(trace.with_poisson_arrivals(rate, seed), "{rate}", rate)
    return _finite_arrivals(trace.time_scaled(time_scale), "{time_scale}", time_scale)


def _reader(trace_format: str, text_tokens: TextTokens) -> Callable[[Path], Trace]:
    """The reader of one format: those of the text formats and of the benchmarks' configs are imported when their
    format is asked for, so that reading a YAML trace loads none of them."""
    readers: dict[str, Callable[[Path], Trace]] = {
        "yaml": load_yaml_trace,
        "azure": read_azure,
        "mooncake": read_mooncake,
        "lengths-csv": read_lengths_csv,
    }
    if trace_format in readers:
        return readers[trace_format]
    if trace_format == "aiperf":
        from minipaged_cli.workloads.aiperf import read_aiperf

        return functools.partial(read_aiperf, text_tokens=text_tokens)
    if trace_format == "sharegpt":
        from minipaged_cli.workloads.sharegpt import read_sharegpt

        return functools.partial(read_sharegpt, text_tokens=text_tokens)
    from minipaged_cli.workloads.bench_configs import BENCHMARK_CONFIGS

    return BENCHMARK_CONFIGS[trace_format]


def _finite_arrivals(trace: Trace, option: str, value: float) -> Trace:
    """An option that re-times the trace can push arrival times past a float's range (``--rate 1e-310`` makes
    gaps of 1e310 s): a replay at an infinite time has no makespan or latency, so such a value is refused."""
    if not math.isfinite(trace.requests[-1].arrival_s):
        hint = "a larger rate" if option == "{rate}" else "a smaller scale"
        raise InputError(f"arrival times overflow to infinity; use {hint}", field=option, value=value, has_value=True)
    return trace
