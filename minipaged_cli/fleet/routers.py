"""Routers: which replica of a pool takes a request, from what the replicas publish (SPEC section 9).

``round-robin`` cycles; ``least-loaded`` takes the fewest queued requests, then the lowest KV usage, then the
fewest running; ``prefix-aware`` the longest cached prefix of the request's blocks (``precise``: the replicas' KV
events; ``approximate``: the router's own index, ``prefix_index.py``) among the replicas with room (no request
waiting at their last step; all of them when none has room); ``session-affinity`` the replica that answered the
session's last turn (a first turn, or a request of no session, ties everywhere); ``weighted`` the highest sum of
weighted scores in [0, 1], as llm-d's scorers: prefix (matched / prompt blocks), queue ((max - q) / (max - min)
over the pool; 1 when all are equal), kv (1 - usage), session (1 for the replica that answered the session's last
turn, else 0). Ties, which llm-d, SGLang's gateway and Dynamo break at random, go to the least loaded, then to
the lowest index: every run routes the same way.

The session score is llm-d's session-affinity scorer: the response carries a cookie naming the endpoint that
served it, and the next request of the session scores 1.0 there and 0.0 elsewhere; the cookie changes with each
response, so the score follows the last answer (``served``), not the session's first replica.
llm-d: llm-d-router, package sessionaffinity::SessionAffinity.Score
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from minipaged_cli.fleet.config import RouterConfig
from minipaged_cli.fleet.prefix_index import ApproximateIndex
from minipaged_cli.fleet.prompt_keys import PromptKeys
from minipaged_cli.fleet.replica import Replica, ReplicaState


@dataclass(frozen=True)
class Decision:
    """One routing decision: the chosen replica (its fleet index) and each candidate's score."""

    time_s: float
    request: int  # its index in the fleet's trace
    replica: int
    scores: tuple[float, ...]

    def to_dict(self) -> dict[str, object]:
        return {"time_s": round(self.time_s, 6), "request": self.request, "replica": self.replica,
                "scores": [round(s, 6) for s in self.scores]}


class Router:
    """Routes over one pool's ``replicas``; ``choose`` returns the chosen replica and the decision."""

    def __init__(self, config: RouterConfig, replicas: Sequence[Replica]) -> None:
        self.config = config
        self.replicas = list(replicas)
        self.next_index = 0  # round-robin's turn
        self.index = ApproximateIndex(config.index_capacity) \
            if config.reads_prefixes and config.prefix_index == "approximate" else None
        self.last_served: dict[str, int] = {}  # session -> the pool position of the replica of its last answer

    def figures(self) -> dict[str, int]:
        """What the router itself holds: the approximate index's entries and how many it forgot."""
        if self.index is None:
            return {}
        return {"index_entries": len(self.index.entries), "index_forgotten": self.index.num_forgotten}

    @property
    def needs_block_hashes(self) -> bool:
        return self.config.reads_prefixes

    def served(self, session: str, replica: Replica) -> None:
        """A turn of ``session`` was answered by ``replica`` (the cookie its response sets)."""
        self.last_served[session] = self.replicas.index(replica)

    def choose(self, fleet_index: int, keys: PromptKeys | None, at: float,
               session: str | None = None) -> tuple[Replica, Decision]:
        """The replica that takes request ``fleet_index`` (its prompt's full blocks' ``keys`` where the router
        reads prefixes; the session it is a turn of, if any) at ``at``."""
        replicas, name = self.replicas, self.config.name
        if name == "round-robin":
            chosen = self.next_index % len(replicas)
            self.next_index += 1
            scores = tuple(float(i == chosen) for i in range(len(replicas)))
        else:
            # Each replica as of its last step ended by ``at`` (its KV events published then), read once
            states = [r.state_at(at) for r in replicas]
            loads = [r.load(state) for r, state in zip(replicas, states, strict=True)]
            scores = tuple(self._scores(keys, states, loads, self.last_served.get(session, -1)))
            best = max(scores)
            # (a tie within rounding counts as a tie: weighted sums of floats)
            tied = [i for i, score in enumerate(scores) if score >= best - 1e-12]
            chosen = min(tied, key=lambda i: (loads[i], i))
        replica = replicas[chosen]
        if self.index is not None and keys is not None:
            self.index.sent(replica.index, keys.all())
        return replica, Decision(at, fleet_index, replica.index, scores)

    def route(self, fleet_index: int, keys: PromptKeys | None, at: float, session: str | None = None) -> Replica:
        """``choose``'s replica, without the decision's scores. Under ``prefix-aware`` over the replicas' KV events,
        a replica's match is counted only where it may change the choice: the best match so far (``best`` leading
        blocks) and the least loaded replica with it (``winner``, ``choose``'s tie-break) are kept, and a replica
        whose index lacks the prompt's ``best``-th key holds fewer than ``best`` leading blocks (it neither beats
        nor ties); one that lacks the next key cannot beat the best, and only a tie with a lighter load than the
        winner's would take it. (Every arrival reads every replica; most hold the same leading blocks.) Any other
        router: ``choose``'s."""
        if self.config.name != "prefix-aware" or self.index is not None or keys is None:
            return self.choose(fleet_index, keys, at, session)[0]
        replicas = self.replicas
        states = [r.state_at(at) for r in replicas]  # (each replica's KV events published as of ``at``)
        candidates = [i for i, state in enumerate(states) if state.num_waiting == 0] or range(len(replicas))
        best, winner = -1, (0, 0.0, 0, 0)  # (the best match so far, the (load, position) that takes it)
        for i in candidates:
            replica = replicas[i]
            events, load = replica.events, (*replica.load(states[i]), i)
            if events is None:
                matched = 0
            else:
                # (``keys.matched`` built the keys past the best match, or all of them: a next key, or none)
                if best >= 0 and not (best < len(keys.keys) and events.holds(keys.keys[best])):  # (cannot beat)
                    may_tie = best == 0 or events.holds(keys.keys[best - 1])
                    if not (may_tie and load < winner):
                        continue  # (nor take a tie from the winner)
                matched = keys.matched(events.matched_blocks)
            if matched > best or (matched == best and load < winner):
                best, winner = matched, load
        return replicas[winner[-1]]

    def _scores(self, keys: PromptKeys | None, states: list[ReplicaState], loads: list[tuple[int, float, int]],
                last_served: int) -> list[float]:
        name = self.config.name
        if name == "least-loaded":
            return [0.0] * len(loads)  # every replica ties: the least loaded wins
        if name == "session-affinity":
            return [float(i == last_served) for i in range(len(loads))]
        # (a weighted router without a prefix weight is handed no keys: no prefix scores)
        prefix = [0] * len(loads) if keys is None else [self._matched(r, keys) for r in self.replicas]
        if name == "prefix-aware":
            # A replica with requests waiting has no room (vLLM admits whatever fits): the prefix goes elsewhere
            # while another has room, as SGLang's cache-aware router balances (pure affinity would send every
            # request sharing a system prompt to one replica)
            room = [state.num_waiting == 0 for state in states]
            return [float(p) if has_room or not any(room) else -1.0 for p, has_room in zip(prefix, room, strict=True)]
        num_blocks = 0 if keys is None else keys.num_blocks
        weights = dict(self.config.weights)
        queues = [q for q, _, _ in loads]
        low, high = min(queues), max(queues)
        sessions = [float(i == last_served) for i in range(len(loads))]
        return [weights.get("prefix", 0.0) * (p / num_blocks if num_blocks else 0.0)
                + weights.get("queue", 0.0) * ((high - q) / (high - low) if high > low else 1.0)
                + weights.get("kv", 0.0) * (1.0 - usage)
                + weights.get("session", 0.0) * session
                for p, (q, usage, _), session in zip(prefix, loads, sessions, strict=True)]

    def _matched(self, replica: Replica, keys: PromptKeys) -> int:
        """The leading prompt blocks ``replica`` holds as the router knows it (its index, or the KV events the
        replica published by the time ``choose`` read its state)."""
        if self.index is not None:
            return self.index.matched_blocks(replica.index, keys.all())
        return 0 if replica.events is None else keys.matched(replica.events.matched_blocks)
