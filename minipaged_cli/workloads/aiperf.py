"""AIPerf's custom datasets (JSONL, a JSON object a line), read as a trace (format ``aiperf``).

- single turn: ``{"text": ..., "output_length": 40, "timestamp": 1200}`` (or ``texts``, or ``input_length`` in
  tokens); rows sharing a ``session_id`` are sent one after another, ``delay`` (ms) after the previous answer, each
  self-contained (AIPerf accumulates no history for them); rows without one arrive at their ``timestamp`` (ms; 0
  without).
- multi turn: ``{"session_id": "chat-1", "turns": [{"text": ..., "output_length": 40}, {"text": ..., "delay":
  2000, "output_length": 30}]}``: a conversation, each turn's prompt the history plus its text; the first turn's
  ``timestamp`` starts it.

Text is counted in tokens by ``text_tokens.TextTokens``. ``output_length`` is required: AIPerf falls back to
its ``--osl`` option, which a file does not carry.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from minipaged_cli.errors import InputError
from minipaged_cli.input_files import read_json_lines
from minipaged_cli.validation import finite_number, token_count
from minipaged_cli.workloads.request import Request
from minipaged_cli.workloads.sessions import Turn, sessions_of
from minipaged_cli.workloads.text_tokens import ESTIMATED, TextTokens
from minipaged_cli.workloads.trace import Trace, make_trace


def read_aiperf(path: Path, text_tokens: TextTokens = ESTIMATED) -> Trace:
    source = str(path)
    requests: list[Request] = []
    sessions: dict[str, list[tuple[float | None, Turn]]] = {}
    for where, row in read_json_lines(path):
        if "turns" in row:
            turns = row["turns"]
            if not isinstance(turns, list) or not turns:
                raise InputError("expected a list of one turn or more", source=source, where=where, field="turns",
                                 value=turns, has_value=True)
            name = str(row.get("session_id") or f"session-{where.split()[-1]}")
            if name in sessions:
                raise InputError("a session on two lines", source=source, where=where, field="session_id",
                                 value=name, has_value=True)
            sessions[name] = [_turn(turn, source, f"{where} turns[{index}]", text_tokens, whole_prompt=False)
                              for index, turn in enumerate(turns)]
        elif row.get("session_id") is not None:
            timed_turn = _turn(row, source, where, text_tokens, whole_prompt=True)
            sessions.setdefault(str(row["session_id"]), []).append(timed_turn)
        else:
            start, turn = _turn(row, source, where, text_tokens, whole_prompt=True)
            requests.append(Request(f"aiperf-{len(requests)}", start or 0.0, turn.input_tokens, turn.output_tokens))
    return make_trace(path.stem, requests, source=source,
                      sessions=sessions_of(sessions),
                      description=f"AIPerf custom dataset {path.name}")


def _turn(row: Any, source: str, where: str, text_tokens: TextTokens, *,
          whole_prompt: bool) -> tuple[float | None, Turn]:
    """A turn of a row: (its timestamp in seconds or None, the turn)."""
    if not isinstance(row, dict):
        raise InputError("expected a JSON object", source=source, where=where)
    if row.get("input_length") is not None:
        prompt = token_count(row["input_length"], field="input_length", source=source, where=where)
    else:
        texts = row.get("texts") if row.get("text") is None else [row["text"]]
        if not isinstance(texts, list) or not texts or not all(isinstance(t, str | dict) for t in texts):
            raise InputError("expected text, texts or input_length", source=source, where=where, field="text")
        prompt = sum(text_tokens.count(_content(t, source, where)) for t in texts)
    if row.get("output_length") is None:
        raise InputError("missing (AIPerf takes it from --osl, which the file does not carry)", source=source,
                         where=where, field="output_length")
    output = token_count(row["output_length"], field="output_length", source=source, where=where)
    seconds = {key: finite_number(row[key], field=key, source=source, where=where, minimum=0.0) / 1000.0
               for key in ("timestamp", "delay") if row.get(key) is not None}
    return seconds.get("timestamp"), Turn(prompt, output, delay_s=seconds.get("delay", 0.0), whole_prompt=whole_prompt)


def _content(text: str | dict[str, Any], source: str, where: str) -> str:
    """A text, or AIPerf's Text object ``{"name": ..., "contents": [...]}``: its contents joined."""
    if isinstance(text, str):
        return text
    contents = text.get("contents")
    if not isinstance(contents, list) or not all(isinstance(c, str) for c in contents):
        raise InputError("expected a list of strings", source=source, where=where, field="texts.contents",
                         value=contents, has_value=True)
    return " ".join(contents)
