"""A request inside the engine: what the scheduler moves between its queues and the accounting measures."""

from __future__ import annotations

from dataclasses import dataclass

from minipaged_cli.memory.allocators import Holding
from minipaged_cli.workloads.trace import Request


@dataclass(eq=False, slots=True)  # identity: the scheduler looks requests up in its lists
class LiveRequest(Holding):
    """A request (or one of its parallel samples) inside the engine."""

    request: Request | None = None
    request_index: int = 0
    sample: int = 0  # parallel sampling: 0, then 1..n-1 (v0 forks them after 0's prefill; v1 queues them)
    num_computed: int = 0  # L: tokens whose KV is written
    num_generated: int = 0  # output tokens sampled so far
    # Tokens to prefill at the next admission (vLLM v1: request.num_tokens then): the prompt, plus the tokens it
    # generated before a recompute preemption.
    num_prefill_tokens: int = 0
    first_token_s: float | None = None
    queried: bool = False  # its prompt was looked up in the prefix cache once (later lookups are re-prefills)
    # Its blocks' content keys (``block_hashes``) are built: with prefix caching, once it nears the waiting
    # queue's head (``Scheduler._enqueue``), not at arrival.
    keys_built: bool = False
    # Its keys past the segments another request names are ``pool_loops.PRIVATE`` (``Scheduler._build_keys``)
    private_keys: bool = False
    num_cached_tokens: int = 0  # prompt tokens that lookup found cached (vLLM's Request.num_cached_tokens)
    forked: bool = False  # its other samples exist (v0: forked after its prefill, or it is one of them; v1: always)
    swapped_slots: int = 0  # slots of its KV in the CPU pool while swapped out
    # Tokens after its computed ones that a tier below the GPU is loading (sim/tiers.py); it computes nothing
    # before ``ready_s``.
    loading_tokens: int = 0
    ready_s: float = 0.0

    @property
    def prefill_done(self) -> bool:
        return self.num_computed >= self.num_prefill_tokens
