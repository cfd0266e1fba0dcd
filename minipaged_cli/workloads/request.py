"""One request of a workload: what arrives at the engine, prefills and generates."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass


@dataclass(frozen=True)
class Request:
    """One request: arrives, prefills ``prompt_tokens``, then generates ``output_tokens`` one step at a time.

    ``n`` > 1 is parallel sampling: after the prefill, ``n`` sequences each generate ``output_tokens``, forked
    from the one prompt (its blocks shared until written).

    ``runs``: a session turn's prompt after its ``prefix`` segments, as labelled runs of tokens (earlier turns'
    inputs and outputs, then its own input; ``workloads/sessions.py``); its output is the run ``("out", id)``.
    Equal labels in equal order are equal tokens, so the prefix cache finds a turn's history in the blocks the
    earlier turns computed. Empty: the prompt is the request's own, as is its output.
    """

    id: str
    arrival_s: float
    prompt_tokens: int
    output_tokens: int
    prefix: tuple[str, ...] = ()
    n: int = 1
    runs: tuple[tuple[Hashable, int], ...] = ()
    # The shared segment its output is, for later requests to name in their prefix: a conversation written out
    # as plain requests (each later turn's prefix the earlier inputs and outputs), its outputs' blocks found again
    # as a session's are. One sample only (``n`` = 1); the segment holds ``output_tokens``.
    output_segment: str | None = None

    @classmethod
    def plain(cls, id: str, arrival_s: float, prompt_tokens: int, output_tokens: int,
              prefix: tuple[str, ...] = ()) -> Request:
        """``Request(id, arrival_s, prompt_tokens, output_tokens, prefix)``, the other fields at their defaults,
        without the frozen ``__init__``'s call a field (a public trace's reader makes tens of thousands)."""
        request = object.__new__(cls)
        request.__dict__.update(id=id, arrival_s=arrival_s, prompt_tokens=prompt_tokens, output_tokens=output_tokens,
                                prefix=prefix, n=1, runs=(), output_segment=None)
        return request

    def arriving_at(self, arrival_s: float) -> Request:
        """This request arriving at ``arrival_s``: ``dataclasses.replace(self, arrival_s=arrival_s)``, without its
        pass over the fields (a trace re-timed, or a fleet's requests handed to replicas, is tens of thousands)."""
        moved = object.__new__(type(self))
        attributes = moved.__dict__
        attributes.update(self.__dict__)
        attributes["arrival_s"] = arrival_s  # (frozen: the attributes are set once, here)
        return moved

    @property
    def total_tokens(self) -> int:
        """prompt + output: what ``--max-model-len`` bounds and what an exact reservation holds."""
        return self.prompt_tokens + self.output_tokens

    @property
    def output_label(self) -> tuple[str, str]:
        """The label of a session turn's output run, as a later turn's ``runs`` names it."""
        return ("out", self.id)
