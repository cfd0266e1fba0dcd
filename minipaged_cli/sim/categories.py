"""Where a KV pool's slots go: the memory categories, defined once for ``simulate``, ``profile`` and ``run``.

At one moment, for the live requests, each of current length L (tokens whose K/V is written), final length F
and A allocated slots, in a pool of C slots where S slots are held by more than one request (a prefix-cache hit
or a forked sample holds the same block: the per-request sums count it once per holder)::

    token_state      Σ L - S                  K/V of tokens that exist
    reserved_future  Σ (min(A, F) - L)        slots that tokens still to come will fill
    internal_frag    Σ max(A - F, 0)          slots past the final length: never filled (the vLLM paper's internal
                                              fragmentation, the one meaning here)
    external_frag    free slots in holes smaller than the smallest waiting request's need (0 when nobody waits;
                     0 for paging: any free block serves any request)
    free             C - used - external_frag
    used             Σ A - S                  (``kv_cache_usage_perc``: blocks in use / total, as vLLM's
                                              1 - free / (num_gpu_blocks - 1), cached-but-free blocks free)

The five categories sum to C. A paged sequence's tail (the unfilled slots of its last block, ``A - L``) is
reserved-future while the request will still fill it and internal fragmentation for the part past F; ``profile``
reports the whole tail as ``tail_waste_pct``, a share of the allocated slots, not of C.
"""

from __future__ import annotations

CATEGORIES = ("token_state", "reserved_future", "internal_frag", "external_frag", "free")
LABELS = {
    "token_state": "token states",
    "reserved_future": "reserved",
    "internal_frag": "internal frag",
    "external_frag": "external frag",
    "free": "free",
}
USED = len(CATEGORIES)  # index of the used slots, after the five categories, in ``category_slots``' result


def category_slots(tokens: float, allocated: float, internal: float, external: float, capacity: float,
                   shared: float = 0.0) -> tuple[float, ...]:
    """[token_state, reserved_future, internal_frag, external_frag, free, used] in slots (or slot-seconds: the
    formulas are linear, so integrals over time go in and come out the same way).

    ``tokens`` = Σ L and ``allocated`` = Σ A over live requests, ``internal`` = Σ max(A - F, 0), ``external`` the
    external fragmentation, ``shared`` = S, the slots the per-request sums count more than once. (A tuple of
    numbers, not an array: a replay records one a step, and NumPy's cost a call is most of six numbers' work.)
    """
    token_state = tokens - shared
    used = allocated - shared
    return token_state, used - token_state - internal, internal, external, capacity - used - external, used


def tail_waste_pct(unused_slot_time: float, allocated_slot_time: float) -> float:
    """Allocated slots not holding a token (Σ (A - L), the tails), % of the allocated slots; both arguments are
    time integrals (slot-seconds) over the same steps."""
    return 100.0 * unused_slot_time / allocated_slot_time if allocated_slot_time else 0.0
