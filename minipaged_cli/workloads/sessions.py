"""Sessions: multi-turn conversations and agent loops, as requests whose prompts hold their history.

A session is an ordered list of turns. A turn has its new input (starting with named shared segments: a tool
schema, a document), its output, the delay after what it waits for (think time or tool latency) and what it waits
for: by default the turn before it; ``after`` names earlier turns (several: fan-in, the parallel calls an agent
joins; none: it starts with the session). A turn's prompt is the session's prefix segments, then the input and
output of every turn it depends on, directly or not, in session order, then its own input: the conversation so
far. Its blocks are identified by that history (``Request.runs``), so the prefix cache reuses earlier prompts and
earlier outputs block for block, as vLLM's chained hashes do; the last generated token of a turn is never cached
(its KV is never computed), a partial last block is not reused, and a turn whose history was evicted recomputes it.

A turn is sent at run time: when the last turn it waits for has finished, plus its delay (``sim/clients.py``);
its ``arrival_s`` in the trace is the earliest that can be (every answer instant), which orders the trace.

Invariants: a turn waits only for earlier turns of its session (so there is no cycle); a turn's prompt tokens are
its prefix segments plus its runs.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass

from minipaged_cli.errors import InputError, did_you_mean
from minipaged_cli.workloads.request import Request


@dataclass(frozen=True)
class Turn:
    """One turn: ``input_tokens`` new tokens (the first ones the shared ``segments``), ``output_tokens`` generated,
    sent ``delay_s`` after the turns it waits for finished (``after``: indices of earlier turns; None: the one
    before it, or the session's start for the first turn; ``()``: the session's start)."""

    input_tokens: int
    output_tokens: int
    delay_s: float = 0.0
    segments: tuple[str, ...] = ()
    after: tuple[int, ...] | None = None
    name: str = ""  # its id in the session; default its index
    # The input is the whole prompt, no history prepended: traces whose rows give each turn's full context
    # (Mooncake's input_length with hash_ids, AIPerf's self-contained single turns); the session only orders them.
    whole_prompt: bool = False


@dataclass(frozen=True)
class Session:
    """A conversation or agent task: its turns, its start, the shared segments its prompts begin with."""

    id: str
    turns: tuple[Turn, ...]
    start_s: float = 0.0
    prefix: tuple[str, ...] = ()

    def turn_id(self, index: int) -> str:
        return f"{self.id}/{self.turns[index].name or index}"

    def dependencies(self, index: int) -> tuple[int, ...]:
        after = self.turns[index].after
        if after is None:
            return (index - 1,) if index else ()
        return after


@dataclass(frozen=True)
class TurnLink:
    """Where a request sits in a session and when it is sent: ``delay_s`` after every request of ``after`` (ids)
    finished, or after the session's start when ``after`` is empty."""

    session: str
    index: int
    after: tuple[str, ...]
    delay_s: float


def session_requests(session: Session, segments: dict[str, int], *, source: str,
                     where: str) -> list[tuple[Request, TurnLink]]:
    """The session's turns as requests (prompts holding their history) and their links; ``where`` places the
    session in its file for errors."""
    if not session.turns:
        raise InputError("a session needs at least one turn", source=source, where=where, field="turns")
    for name in session.prefix:
        _segment_tokens(name, segments, source, where, "prefix")
    ids = [session.turn_id(index) for index in range(len(session.turns))]
    ancestors: list[frozenset[int]] = []
    earliest: list[float] = []
    own: list[tuple[tuple[Hashable, int], ...]] = []
    pairs = []
    for index, turn in enumerate(session.turns):
        turn_where = f"{where} turns[{index}]"
        dependencies = session.dependencies(index)
        for dependency in dependencies:
            if not 0 <= dependency < index:
                raise InputError("a turn waits only for earlier turns of its session (a cycle otherwise)",
                                 source=source, where=turn_where, field="after", value=list(dependencies),
                                 has_value=True)
        ancestors.append(frozenset().union(*(ancestors[d] | {d} for d in dependencies)))
        segment_tokens = sum(_segment_tokens(name, segments, source, turn_where, "segments")
                             for name in turn.segments)
        if segment_tokens > turn.input_tokens:
            raise InputError(f"its segments hold {segment_tokens} tokens, more than its input's "
                             f"{turn.input_tokens}", source=source, where=turn_where, field="segments",
                             value=list(turn.segments), has_value=True)
        own.append((*((name, segments[name]) for name in turn.segments),
                    (("in", ids[index]), turn.input_tokens - segment_tokens)))
        runs: list[tuple[Hashable, int]] = []
        for earlier in () if turn.whole_prompt else sorted(ancestors[index]):
            runs += [*own[earlier], (("out", ids[earlier]), session.turns[earlier].output_tokens)]
        runs += own[index]
        start = max((earliest[d] for d in dependencies), default=session.start_s)
        earliest.append(start + turn.delay_s)
        prefix = () if turn.whole_prompt else session.prefix
        request = Request(id=ids[index], arrival_s=earliest[index],
                          prompt_tokens=sum(segments[name] for name in prefix) + sum(length for _, length in runs),
                          output_tokens=turn.output_tokens, prefix=prefix, runs=tuple(runs))
        pairs.append((request, TurnLink(session.id, index, tuple(ids[d] for d in dependencies), turn.delay_s)))
    return pairs


def sessions_of(rows: dict[str, list[tuple[float | None, Turn]]]) -> list[Session]:
    """Sessions from a trace's rows grouped by session id: (the row's start time or None, its turn), in order;
    the first row's time starts the session (0 without)."""
    return [Session(name, tuple(turn for _, turn in turns), start_s=turns[0][0] or 0.0)
            for name, turns in rows.items()]


def _segment_tokens(name: str, segments: dict[str, int], source: str, where: str, field: str) -> int:
    if name not in segments:
        raise InputError(f"unknown segment{did_you_mean(name, segments, cutoff=0.5)}; define it under 'segments'",
                         source=source, where=where, field=field, value=name, has_value=True)
    return segments[name]
