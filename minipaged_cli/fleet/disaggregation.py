"""Prefill/decode disaggregation: a prefill replica computes the prompt (and its first token, which the client does
not see), the KV crosses a link to a decode replica, which admits the request once the transfer has landed and its
blocks are free, recomputes the last prompt token (vLLM's rule for a full external hit) and decodes.

``KvTransfers`` is the link: one queue of transfers, each the prompt's KV as the pool holds it (``transfer_bytes``:
KV cache groups, sliding windows, latent attention and an fp8 cache all count) at the link's bandwidth, plus its
latency. ``RemoteKv`` stands where a decode replica's scheduler looks for KV below its GPU (vLLM's KV
connector, ``WAITING_FOR_REMOTE_KVS``): at a request's first admission every prompt token but the last is there,
unless the prompt is short enough that it prefilled locally (``prefill_threshold``).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from minipaged_cli.fleet.config import KvLink
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.tiers import Link


def transfer_bytes(config: SimConfig, num_tokens: int) -> int:
    """The KV of ``num_tokens`` prompt tokens: in each KV cache group's layers, every token for full attention,
    the last ``sliding_window`` for a sliding window (what the pool keeps); the bytes per token and layer carry
    latent attention and the KV cache's element type."""
    per_layer = config.model.kv_bytes_per_token_per_layer
    return sum(len(group.layer_indices) * per_layer
               * (min(num_tokens, group.sliding_window or num_tokens) if group.is_sliding else num_tokens)
               for group in config.kv_cache_groups)


class KvTransfers:
    """The P -> D link's clock (``sim.tiers.Link``) and what crossed it."""

    def __init__(self, link: KvLink) -> None:
        self.link = Link(link.bandwidth_bytes_per_s)
        self.latency_s = link.latency_s
        self.num_transfers = 0
        self.wait_s = 0.0  # queued behind earlier transfers, summed

    def send(self, num_bytes: int, at: float) -> float:
        """A transfer of ``num_bytes`` issued at ``at``; when it lands."""
        self.wait_s += max(0.0, self.link.busy_until - at)
        self.num_transfers += 1
        return self.link.reserve(at, num_bytes) + self.latency_s

    def to_dict(self, makespan_s: float) -> dict[str, object]:
        return {"bandwidth_bytes_per_s": self.link.bytes_per_s, "latency_s": self.latency_s,
                "transfers": self.num_transfers, "bytes": self.link.num_bytes,
                "busy_pct": round(100.0 * self.link.busy_s / makespan_s, 6) if makespan_s > 0 else 0.0,
                "queued_s": round(self.wait_s, 6)}


class RemoteKv:
    """A decode replica's source of transferred KV, in the scheduler's place for the tiers (``load``)."""

    def __init__(self, prefill_threshold: int) -> None:
        self.prefill_threshold = prefill_threshold
        self.loaded_tokens = 0

    def load(self, block_hashes: Sequence[Hashable], num_cached: int, num_prompt: int, now: float,
             count_hits: bool) -> tuple[int, float]:
        """At the first admission of a transferred prompt: its tokens after the replica's own hits but the last,
        there now (the transfer landed before the request reached the replica). A re-prefill after a preemption
        recomputes: the transferred KV went with the blocks."""
        if not count_hits or num_prompt <= self.prefill_threshold:
            return 0, now
        tokens = max(0, num_prompt - 1 - num_cached)
        self.loaded_tokens += tokens
        return tokens, now

    def request_done(self, block_hashes: Sequence[Hashable], num_prompt: int) -> None:
        """(Nothing to forget: the tiers' output names have no counterpart here.)"""
