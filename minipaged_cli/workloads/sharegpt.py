"""ShareGPT's conversation JSON, read as a trace (format ``sharegpt``): each conversation a session.

The file is a list of ``{"id": ..., "conversations": [{"from": "human", "value": ...}, {"from": "gpt", "value":
...}, ...]}``. A turn is what the user (or the system) wrote since the last answer, its output the answer that
follows; a leading answer and a trailing question without an answer are left out, as vLLM's benchmark pairs them.
Text is counted by ``text_tokens.TextTokens``. Every conversation starts at t = 0 and the next turn is sent
as soon as the answer is back (the file has no times): re-time with ``--rate`` (conversation starts) or run with
``--concurrency``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from minipaged_cli.errors import InputError
from minipaged_cli.input_files import parse_json, read_text
from minipaged_cli.workloads.sessions import Session, Turn
from minipaged_cli.workloads.text_tokens import ESTIMATED, TextTokens
from minipaged_cli.workloads.trace import Trace, make_trace

_ASKING = {"human", "user", "system"}
_ANSWERING = {"gpt", "chatgpt", "assistant", "bard", "bing", "model"}


def read_sharegpt(path: Path, text_tokens: TextTokens = ESTIMATED) -> Trace:
    source = str(path)
    document = parse_json(read_text(path), source)
    if not isinstance(document, list):
        raise InputError("expected a list of conversations", source=source)
    sessions = []
    for index, entry in enumerate(document):
        where = f"[{index}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("conversations"), list):
            raise InputError("expected an object with a 'conversations' list", source=source, where=where)
        turns = _turns(entry["conversations"], source, where, text_tokens)
        if turns:
            sessions.append(Session(str(entry.get("id", index)), tuple(turns)))
    if not sessions:
        raise InputError("no conversation has a question and its answer", source=source)
    names = [s.id for s in sessions]
    if len(set(names)) < len(names):  # ids repeat in the public dumps: number them instead
        sessions = [Session(f"{s.id}#{i}", s.turns) for i, s in enumerate(sessions)]
    return make_trace(path.stem, [], source=source, sessions=sessions,
                      description=f"ShareGPT conversations {path.name}")


def _turns(messages: list[Any], source: str, where: str, text_tokens: TextTokens) -> list[Turn]:
    turns = []
    asked = 0
    for number, message in enumerate(messages):
        place = f"{where}.conversations[{number}]"
        if not isinstance(message, dict) or not isinstance(message.get("value"), str):
            raise InputError("expected an object with 'from' and a 'value' string", source=source, where=place)
        speaker = message.get("from")
        if speaker in _ASKING:
            asked += text_tokens.count(message["value"])
        elif speaker in _ANSWERING:
            if asked:
                turns.append(Turn(asked, text_tokens.count(message["value"])))
            asked = 0
        else:
            raise InputError(f"expected one of {', '.join(sorted(_ASKING | _ANSWERING))}", source=source,
                             where=place, field="from", value=speaker, has_value=True)
    return turns
