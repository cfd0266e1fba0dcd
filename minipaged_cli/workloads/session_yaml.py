"""The YAML trace's sessions: the ``sessions:`` list (each session's turns written out) and the ``generate:`` form
of a group with ``turns`` (seeded sessions: turn count, think time, input and output lengths, shared segments).

```yaml
sessions:
  - id: chat-1
    start_s: 0.0                 # when its first turn is sent (open-loop clients)
    prefix: [system-a]           # shared segments its prompts begin with
    turns:
      - {input_tokens: 1000, output_tokens: 40}
      - {input_tokens: 60, output_tokens: 41, delay_s: 2.5}               # 2.5 s after turn 0's answer
      - {id: search, input_tokens: 30, output_tokens: 20, after: [1]}     # fan-out: two calls after turn 1
      - {id: fetch, input_tokens: 30, output_tokens: 20, after: [1]}
      - {input_tokens: 200, output_tokens: 80, after: [search, fetch], segments: [doc-a]}   # fan-in
generate:
  - count: 100                   # 100 sessions
    seed: 3
    arrival: {process: poisson, rate_per_s: 0.5}      # session starts
    turns: {dist: uniform, low: 2, high: 8}           # turns per session
    delay_s: {dist: lognormal, median: 4.0, sigma: 0.5}
    prompt_tokens: {dist: lognormal, median: 200, sigma: 0.7}   # each turn's new input
    output_tokens: {dist: uniform, low: 20, high: 400}
    prefix: [system-a]
```
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import yaml

from minipaged_cli.errors import InputError
from minipaged_cli.validation import MAX_REQUESTS
from minipaged_cli.workloads.fields import Fields, read_group, sample_lengths, sample_seconds
from minipaged_cli.workloads.sessions import Session, Turn

_SESSION_GROUP_KEYS = {"count", "seed", "arrival", "turns", "delay_s", "prompt_tokens", "output_tokens",
                      "id_prefix", "prefix"}
_SESSION_KEYS = {"id", "start_s", "prefix", "turns"}
_TURN_KEYS = {"id", "input_tokens", "output_tokens", "delay_s", "segments", "after", "whole_prompt"}


def read_sessions(raw: Any, source: str) -> list[Session]:
    """The ``sessions:`` list."""
    if not isinstance(raw, list):
        raise InputError("expected a list", source=source, field="sessions", value=raw, has_value=True)
    return [_read_session(entry, index, source) for index, entry in enumerate(raw)]


def _read_session(entry: Any, index: int, source: str) -> Session:
    session_id = entry.get("id") if isinstance(entry, dict) else None
    where = f"sessions[{index}]" + (f" (id {session_id})" if session_id is not None else "")
    reader = Fields(source, where)
    if not isinstance(entry, dict):
        raise reader.error("expected a mapping", None, entry)
    reader.check_keys(entry, _SESSION_KEYS)
    if not isinstance(reader.get(entry, "id"), str | int) or isinstance(session_id, bool):
        raise reader.error("must be a string or an integer", "id", session_id)
    turns = entry.get("turns")
    if not isinstance(turns, list) or not turns:
        raise reader.error("expected a list of one turn or more", "turns", turns)
    names: dict[str, int] = {}
    read = []
    for position, turn in enumerate(turns):
        read.append(_read_turn(turn, Fields(source, f"{where} turns[{position}]"), names))
        names[read[-1].name or str(position)] = position
    return Session(id=str(session_id), turns=tuple(read), start_s=reader.number(entry, "start_s", minimum=0.0,
                                                                                  default=0.0),
                   prefix=reader.prefix(entry))


def _read_turn(entry: Any, reader: Fields, earlier: dict[str, int]) -> Turn:
    if not isinstance(entry, dict):
        raise reader.error("expected a mapping", None, entry)
    reader.check_keys(entry, _TURN_KEYS)
    name = entry.get("id", "")
    if not isinstance(name, str | int) or isinstance(name, bool) or str(name) in earlier:
        raise reader.error("must be a string or an integer, unique in its session", "id", name)
    after = entry.get("after")
    if after is not None:
        if not isinstance(after, list):
            raise reader.error("expected a list of earlier turns (their ids; indices for turns without one)",
                               "after", after)
        if any(str(turn) not in earlier for turn in after):
            raise reader.error("a turn waits only for earlier turns of its session (a cycle otherwise)",
                               "after", after)
        after = tuple(earlier[str(turn)] for turn in after)
    segments = entry.get("segments", [])
    if not isinstance(segments, list) or not all(isinstance(s, str) for s in segments):
        raise reader.error("expected a list of segment names", "segments", segments)
    return Turn(input_tokens=reader.tokens(entry, "input_tokens"), output_tokens=reader.tokens(entry, "output_tokens"),
                delay_s=reader.number(entry, "delay_s", minimum=0.0, default=0.0), segments=tuple(segments),
                after=after, name=str(name), whole_prompt=_flag(entry, "whole_prompt", reader))


def _flag(entry: dict[str, Any], key: str, reader: Fields) -> bool:
    value = entry.get(key, False)
    if not isinstance(value, bool):
        raise reader.error("expected true or false", key, value)
    return value


def generate_sessions(group: dict[str, Any], index: int, source: str) -> list[Session]:
    """A ``generate:`` group with ``turns``: ``count`` seeded sessions, each turn sent ``delay_s`` after the
    previous answer."""
    head = read_group(group, index, source, _SESSION_GROUP_KEYS, "gen")
    reader, where, count, rng, starts, id_prefix = head.reader, head.where, head.count, head.rng, head.arrivals, \
        head.id_prefix
    num_turns = sample_lengths(reader.mapping(group, "turns"), count, rng, Fields(source, f"{where}.turns"))
    total = int(num_turns.sum())
    if total > MAX_REQUESTS:
        raise reader.error(f"the sessions hold {total} turns, more than {MAX_REQUESTS}", "turns", group["turns"])
    inputs = sample_lengths(reader.mapping(group, "prompt_tokens"), total, rng,
                            Fields(source, f"{where}.prompt_tokens"))
    outputs = sample_lengths(reader.mapping(group, "output_tokens"), total, rng,
                             Fields(source, f"{where}.output_tokens"))
    delays = sample_seconds(reader.mapping(group, "delay_s"), total, rng, Fields(source, f"{where}.delay_s")) \
        if "delay_s" in group else np.zeros(total)
    prefix = reader.prefix(group)
    sessions = []
    first = 0
    for number, turns in enumerate(num_turns.tolist()):
        span = range(first, first + turns)
        sessions.append(Session(
            id=f"{id_prefix}{number}", start_s=float(starts[number]), prefix=prefix,
            turns=tuple(Turn(int(inputs[i]), int(outputs[i]), float(delays[i]) if i > first else 0.0)
                        for i in span)))
        first += turns
    return sessions


def dump_sessions(sessions: tuple[Session, ...]) -> list[str]:
    """The ``sessions:`` section, a line per turn, in the form ``read_sessions`` reads."""
    lines = ["sessions:"]
    for session in sessions:
        head = {"id": session.id, "start_s": round(session.start_s, 6),
                **({"prefix": list(session.prefix)} if session.prefix else {})}
        lines += [f"{'  - ' if key == 'id' else '    '}{key}: {json.dumps(value)}" for key, value in head.items()]
        lines.append("    turns:")
        for index, turn in enumerate(session.turns):
            entry: dict[str, Any] = {**({"id": turn.name} if turn.name else {}), "input_tokens": turn.input_tokens,
                                     "output_tokens": turn.output_tokens}
            if turn.delay_s:
                entry["delay_s"] = round(turn.delay_s, 6)
            if turn.segments:
                entry["segments"] = list(turn.segments)
            if turn.whole_prompt:
                entry["whole_prompt"] = True
            if turn.after is not None and turn.after != ((index - 1,) if index else ()):
                entry["after"] = [session.turns[d].name or d for d in turn.after]
            lines.append("      - " + _flow(entry))
    return lines


def _flow(entry: dict[str, Any]) -> str:
    return yaml.safe_dump(entry, default_flow_style=True, sort_keys=False, width=10**6).strip()
