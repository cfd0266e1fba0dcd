"""What one step of a replay is, as the loop hands it on: the work a data plane executes, and its checked time."""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from minipaged_cli.validation import positive_number

if TYPE_CHECKING:
    from minipaged_cli.sim.tiers import TieredCache


@dataclass(frozen=True)
class StepWork:
    """What one step writes, for a data plane to execute: K/V of every new token, then decode attention.

    ``prefills``: (sequence_id, first position, number of tokens) of each prompt chunk; ``decodes``:
    (sequence_id, position) of the one token each decoding sequence writes and attends from (it attends to
    positions 0..position). ``live_tokens``: tokens held by running requests once the step has run, a token in
    a block several requests share counted once.
    ``copies``: (src, dst) blocks that copy-on-write needs copied before any token is written.
    ``forks``: (parent, child) sequences forked after the step's prefill (the child attends to the parent's
    prompt until it writes its own tokens).
    ``loads``: (block hash, GPU block id) filled from a tier below the GPU (host memory, disk) before this step's
    compute; ``stores``: (block hash, GPU block id) copied down to the host tier after this step's compute
    (``sim/tiers.py``). Under ``--offload-policy on-eviction`` the stored blocks are the ones this step's
    allocation evicts: their old content must be copied before the step's compute overwrites it.
    ``tiers``: the replay's tiers below the GPU, as the step left them (a data plane mirroring the host tier asks
    which blocks it still holds); None without tiers.
    """

    prefills: list[tuple[int, int, int]]
    decodes: list[tuple[int, int]]
    live_tokens: int
    copies: list[tuple[int, int]] = field(default_factory=list)
    forks: list[tuple[int, int]] = field(default_factory=list)
    loads: list[tuple[Hashable, int]] = field(default_factory=list)
    stores: list[tuple[Hashable, int]] = field(default_factory=list)
    tiers: TieredCache | None = field(default=None, compare=False, repr=False)


def checked_seconds(seconds: float) -> float:
    """A step time (or a sum of them) as the model gave it, refused unless finite and positive.

    A NaN never advances the clock (the replay would hang) and a zero step time makes throughput infinite."""
    if 0.0 < seconds < math.inf:  # the common case, without the validator's call
        return seconds
    return positive_number(seconds, field="step time (s)", source="the step-time model (--gpu preset or --calibration)")
