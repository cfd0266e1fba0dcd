"""Private keys: a block whose content no other request of the trace names carries ``pool_loops.PRIVATE`` in place
of its key.

With prefix caching every full block gets a key: the pool makes a cache entry for it when it fills and drops the
entry when the block is handed out again, two dict writes a block (millions in a replay of the Mooncake trace). An
entry is read only by a lookup of its key, and a key names its content from the stream's start, so two requests'
keys meet only within a run of segments both name. A block past the first segment of its request's prefix that no
other request names (past the prefix: its own prompt tokens and output) can be looked up by its own request alone,
and only once that request is preempted (vLLM recomputes it, looking its prompt up again). Such a block carries
``PRIVATE``: the pool caches it, queues it among the cached free blocks and counts its eviction, without an entry;
a preempted request takes its keys back before its blocks are freed (``Scheduler._drop``). The decisions and every
figure stay those of every block keyed (``tests/sim/test_private_keys.py``).

Where it applies (``applies``): vLLM v1's recompute on one full-attention group with prefix caching, without tiers
below the GPU, a data plane's ``on_step`` or a subscriber to the pool's events (a fleet router's index of its
replicas' keys), which may read the keys themselves; per request (``Scheduler._build_keys``), one sample, no runs
and no output segment (a session's turns and a request's samples name each other's content).
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Iterable

from minipaged_cli.memory.allocators import Allocator
from minipaged_cli.memory.pool_loops import PRIVATE
from minipaged_cli.memory.prefix import segment_keys
from minipaged_cli.sim.settings import EngineSettings
from minipaged_cli.workloads.trace import Request


def applies(engine: EngineSettings, keyed: bool, allocator: Allocator) -> bool:
    """Whether a replay may give blocks private keys (where no tier comes below the GPU later): prefix caching on
    (``keyed``), v1's recompute, one full-attention group."""
    return keyed and engine.scheduler == "v1" and engine.preemption == "recompute" and not allocator.windowed


def shared_segments(requests: Iterable[Request]) -> set[str]:
    """The segments that two or more of ``requests`` name in their prefix. (Sorted, a name named twice is next to
    itself: a list of the names costs a third of the memory of a count per name, on the Mooncake trace's 290,000.)"""
    names = sorted(itertools.chain.from_iterable(request.prefix for request in requests))
    return {name for name, after in itertools.pairwise(names) if name == after}


def private_keys(request: Request, segments: dict[str, int], shared: set[str], block_size: int) -> list[Hashable]:
    """The request's blocks' keys (``content_keys``, of a request with one sample, no runs and no output segment),
    ``PRIVATE`` from the first block past its prefix's first segment not in ``shared``: a key another request also
    has lies in segments both name. (Two requests may name a segment after different ones: then the key is kept,
    though no lookup will find it; a key that one would find is never private.)"""
    prefix = request.prefix
    if not prefix or prefix[0] not in shared:  # (no other request names its first segment: every key its own)
        return [PRIVATE] * ((request.prompt_tokens + request.output_tokens) // block_size)
    keys = segment_keys(prefix[:len(list(itertools.takewhile(shared.__contains__, prefix)))], segments, (),
                        block_size)
    return keys + [PRIVATE] * ((request.prompt_tokens + request.output_tokens) // block_size - len(keys))
