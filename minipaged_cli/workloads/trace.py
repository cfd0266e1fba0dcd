"""Request traces: the YAML workload format, its validation, and seeded synthetic request groups.

A trace is a list of requests, each arriving at ``arrival_s`` with ``prompt_tokens`` to prefill and
``output_tokens`` to generate, optionally starting with named shared prompt segments (``prefix``). See
README.md's "Traces" section for the format; ``readers.py`` reads the public CSV/JSONL traces into the same form.

(Over 300 lines on purpose: the YAML schema is validated field by field, each error naming the file, the request,
the field and the value; the checks are the bulk of it and belong with the format they check.)
"""

from __future__ import annotations

import operator
import textwrap
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from minipaged_cli.errors import InputError, did_you_mean
from minipaged_cli.input_files import read_yaml
from minipaged_cli.validation import MAX_REQUESTS
from minipaged_cli.workloads.agent_loop import generate_agent_tasks
from minipaged_cli.workloads.fields import Fields, poisson_arrivals, read_group, sample_lengths
from minipaged_cli.workloads.request import Request
from minipaged_cli.workloads.session_yaml import dump_sessions, generate_sessions, read_sessions
from minipaged_cli.workloads.sessions import Session, TurnLink, session_requests

__all__ = ["Request", "Trace", "dump_trace", "load_yaml_trace", "make_trace"]


@dataclass(frozen=True)
class Trace:
    """A workload: requests sorted by arrival time, and the token counts of their shared prefix segments.

    With sessions (``sessions.py``), ``requests`` holds their turns too, each at the earliest time it can be sent,
    and ``turns`` says which requests are turns (request id -> its link): those are sent at run time, when what
    they wait for has finished. ``sessions`` keeps the sessions as written (for ``convert`` and the reports).
    """

    name: str
    requests: tuple[Request, ...]
    segments: dict[str, int] = field(default_factory=dict)
    description: str = ""
    sessions: tuple[Session, ...] = ()
    turns: dict[str, TurnLink] = field(default_factory=dict)

    @property
    def num_requests(self) -> int:
        return len(self.requests)

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.requests)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests)

    @property
    def standalone_requests(self) -> list[Request]:
        """The requests that are no session's turns."""
        return [r for r in self.requests if r.id not in self.turns]

    def limited(self, limit: int | None) -> Trace:
        """The first ``limit`` requests by arrival (a turn only with every turn it waits for), and only the
        segments they use."""
        if limit is None or limit >= len(self.requests):
            return self
        kept: set[str] = set()
        for request in self.requests[:limit]:
            link = self.turns.get(request.id)
            if link is None or all(earlier in kept for earlier in link.after):
                kept.add(request.id)
        requests = [r for r in self.requests[:limit] if r.id in kept and r.id not in self.turns]
        sessions = [kept_turns for s in self.sessions if (kept_turns := _kept_turns(s, kept)) is not None]
        used = {segment for r in self.requests[:limit] if r.id in kept
                for segment in (*r.prefix, *(label for label, _ in r.runs if isinstance(label, str)),
                                *((r.output_segment,) if r.output_segment else ()))}
        segments = {name: tokens for name, tokens in self.segments.items() if name in used}
        return self._rebuilt(requests, sessions, segments)

    def time_scaled(self, time_scale: float) -> Trace:
        """Every arrival time and session start multiplied by ``time_scale`` (< 1 compresses the trace: a higher
        request rate); think times inside sessions are the users' and stay."""
        if time_scale == 1.0:
            return self
        if not self.sessions:
            return replace(self, requests=tuple(r.arriving_at(r.arrival_s * time_scale)
                                                for r in self.requests))
        return self._rebuilt([r.arriving_at(r.arrival_s * time_scale) for r in self.standalone_requests],
                             [replace(s, start_s=s.start_s * time_scale) for s in self.sessions])

    def with_poisson_arrivals(self, rate_per_s: float, seed: int) -> Trace:
        """Arrival times (of requests, and of sessions: their starts) replaced by a seeded Poisson process of
        ``rate_per_s`` (order kept)."""
        rng = np.random.default_rng(seed)
        if not self.sessions:
            times = poisson_arrivals(len(self.requests), rate_per_s, rng)
            requests = tuple(r.arriving_at(float(t)) for r, t in zip(self.requests, times, strict=True))
            return replace(self, requests=requests)
        units: list[Request | Session] = [*self.standalone_requests, *self.sessions]
        first = {r.id: r.arrival_s for r in self.requests}
        units.sort(key=lambda u: first[u.id] if isinstance(u, Request) else first[u.turn_id(0)])
        times = poisson_arrivals(len(units), rate_per_s, rng)
        retimed = [u.arriving_at(float(t)) if isinstance(u, Request) else replace(u, start_s=float(t))
                   for u, t in zip(units, times, strict=True)]
        return self._rebuilt([u for u in retimed if isinstance(u, Request)],
                             [u for u in retimed if isinstance(u, Session)])

    def _rebuilt(self, requests: list[Request], sessions: list[Session],
                 segments: dict[str, int] | None = None) -> Trace:
        return make_trace(self.name, requests, source=self.name, sessions=sessions,
                          segments=self.segments if segments is None else segments, description=self.description)


def _kept_turns(session: Session, kept: set[str]) -> Session | None:
    """The session with only the turns in ``kept`` (which holds every turn a kept turn waits for), ids kept."""
    indices = [i for i in range(len(session.turns)) if session.turn_id(i) in kept]
    if not indices:
        return None
    renumbered = {old: new for new, old in enumerate(indices)}
    turns = tuple(replace(session.turns[i], name=session.turns[i].name or str(i),
                          after=tuple(renumbered[d] for d in session.dependencies(i))) for i in indices)
    return replace(session, turns=turns)


def make_trace(
    name: str,
    requests: list[Request],
    *,
    source: str,
    segments: dict[str, int] | None = None,
    description: str = "",
    sessions: list[Session] | tuple[Session, ...] = (),
) -> Trace:
    """Expand the sessions into their turns' requests, sort by arrival (stably) and check what holds across
    requests: unique ids, known segments."""
    segments = segments or {}
    turns: dict[str, TurnLink] = {}
    all_requests = list(requests)
    for index, session in enumerate(sessions):
        for request, link in session_requests(session, segments, source=source,
                                              where=f"sessions[{index}] (id {session.id})"):
            all_requests.append(request)
            turns[request.id] = link
    if not all_requests:
        raise InputError("the trace has no requests", source=source)
    seen: set[str] = set()
    for index, request in enumerate(all_requests):
        if request.id in seen:
            raise InputError("duplicate request id", source=source, where=_where(index, request), field="id",
                             value=request.id, has_value=True)
        seen.add(request.id)
        if request.id in turns:  # (its segments were checked with its session)
            continue
        try:
            prefix_tokens = sum(map(segments.__getitem__, request.prefix))
        except KeyError:
            where = _where(index, request)
            segment = next(segment for segment in request.prefix if segment not in segments)
            raise InputError(f"unknown segment{did_you_mean(segment, segments, cutoff=0.5)}; define it under "
                             "'segments'", source=source, where=where, field="prefix",
                             value=segment, has_value=True) from None
        if prefix_tokens > request.prompt_tokens:
            raise InputError(f"prefix segments hold {prefix_tokens} tokens, more than the prompt's "
                             f"{request.prompt_tokens}", source=source, where=_where(index, request),
                             field="prefix", value=list(request.prefix), has_value=True)
        if request.output_segment is not None and (segments.get(request.output_segment) != request.output_tokens
                                                   or request.n > 1):
            raise InputError(f"must name a segment of its {request.output_tokens} output tokens, with n = 1",
                             source=source, where=_where(index, request), field="output_segment",
                             value=request.output_segment, has_value=True)
    ordered = sorted(all_requests, key=operator.attrgetter("arrival_s"))
    return Trace(name=name, requests=tuple(ordered), segments=dict(segments), description=description,
                 sessions=tuple(sessions), turns=turns)


def _where(index: int, request: Request) -> str:
    """Where a request of ``make_trace``'s is, in an error (worked out only for one)."""
    return f"requests[{index}] (id {request.id})"


# -- the YAML format ---------------------------------------------------------------------------------------

_TOP_KEYS = {"version", "name", "description", "requests", "generate", "segments", "sessions"}
_REQUEST_KEYS = {"id", "arrival_s", "prompt_tokens", "output_tokens", "prefix", "n", "output_segment"}
_GROUP_KEYS = {"count", "seed", "arrival", "prompt_tokens", "output_tokens", "id_prefix", "prefix", "n"}


def load_yaml_trace(path: Path) -> Trace:
    """Read and validate a YAML trace (the safe loader, duplicate keys refused); every problem is an
    ``InputError`` naming the field."""
    source = str(path)
    document = read_yaml(path)
    if not isinstance(document, dict):
        raise InputError("expected a mapping with a 'requests' or 'generate' list", source=source)
    reader = Fields(source, None)
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
    sessions = read_sessions(document.get("sessions") or [], source)
    for index, group in enumerate(groups):
        if isinstance(group, dict) and "turns" in group:
            sessions.extend(generate_sessions(group, index, source))
        elif isinstance(group, dict) and "steps" in group:
            sessions.extend(generate_agent_tasks(group, index, source))
        else:
            requests.extend(_generate_group(group, index, source))
    name = document.get("name") or path.stem
    description = document.get("description") or ""
    return make_trace(str(name), requests, source=source, segments=segments, description=str(description),
                      sessions=sessions)


def _read_segments(raw: Any, source: str) -> dict[str, int]:
    if not isinstance(raw, dict):
        raise InputError("expected a mapping of segment name to token count", source=source,
                         field="segments", value=raw, has_value=True)
    reader = Fields(source, "segments")
    return {str(name): reader.tokens(raw, name) for name in raw}


def _read_request(entry: Any, index: int, source: str) -> Request:
    request_id = entry.get("id") if isinstance(entry, dict) else None
    where = f"requests[{index}]" + (f" (id {request_id})" if request_id is not None else "")
    if not isinstance(entry, dict):
        raise InputError("expected a mapping", source=source, where=where, value=entry, has_value=True)
    reader = Fields(source, where)
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
        output_segment=str(entry["output_segment"]) if entry.get("output_segment") is not None else None,
    )


def _generate_group(group: Any, index: int, source: str) -> list[Request]:
    if not isinstance(group, dict):
        raise InputError("expected a mapping", source=source, where=f"generate[{index}]", value=group, has_value=True)
    head = read_group(group, index, source, _GROUP_KEYS, "gen")
    reader, where, count, rng = head.reader, head.where, head.count, head.rng
    prompts = sample_lengths(reader.mapping(group, "prompt_tokens"), count, rng,
                             Fields(source, f"{where}.prompt_tokens"))
    outputs = sample_lengths(reader.mapping(group, "output_tokens"), count, rng,
                             Fields(source, f"{where}.output_tokens"))
    prefix = reader.prefix(group)
    n = reader.count(group, "n", minimum=1, maximum=MAX_REQUESTS, default=1)
    return [
        Request(f"{head.id_prefix}{i}", float(head.arrivals[i]), int(prompts[i]), int(outputs[i]), prefix, n)
        for i in range(count)
    ]


def dump_trace(trace: Trace, *, header: str = "") -> str:
    """The trace as YAML in the format ``load_yaml_trace`` reads: explicit requests, one per line, and the
    sessions, a turn per line."""
    document: dict[str, Any] = {"version": 1, "name": trace.name}
    if trace.description:
        document["description"] = trace.description
    if trace.segments:
        document["segments"] = dict(trace.segments)
    lines = [f"# {line}" if line else "#" for text in header.splitlines() for line in textwrap.wrap(text, 110)]
    lines.append(yaml.safe_dump(document, sort_keys=False, width=120).rstrip())
    if trace.sessions:
        lines += dump_sessions(trace.sessions)
    lines.append("requests:")
    for r in trace.standalone_requests:
        entry = {"id": r.id, "arrival_s": round(r.arrival_s, 6), "prompt_tokens": r.prompt_tokens,
                 "output_tokens": r.output_tokens, **({"prefix": list(r.prefix)} if r.prefix else {}),
                 **({"n": r.n} if r.n > 1 else {}),
                 **({"output_segment": r.output_segment} if r.output_segment else {})}
        lines.append("  - " + yaml.safe_dump(entry, default_flow_style=True, sort_keys=False, width=10**6).strip())
    return "\n".join(lines) + "\n"
