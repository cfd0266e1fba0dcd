"""Run in the vLLM 0.33.0 reference venv (tests/sim/test_tiers_hybrid.py starts it): vLLM's own
``OffloadingConnectorScheduler._sliding_window_lookup`` on random patterns of blocks held or not below the GPU;
prints (held, window, end) for each as JSON, for the test to compare with ``sim.tiers.sliding_hit_end``."""

from __future__ import annotations

import json
import random
import sys

from vllm.distributed.kv_transfer.kv_connector.v1.offloading.scheduler import OffloadingConnectorScheduler
from vllm.v1.kv_offload.base import LookupResult


class HeldBlocks:
    """The offloading manager's ``lookup``, answering from a set of held block indices."""

    def __init__(self, held: set[int]) -> None:
        self.held = held

    def lookup(self, key: int, req_context: object) -> LookupResult:
        return LookupResult.HIT if key in self.held else LookupResult.MISS


class Connector:
    """The one attribute ``_sliding_window_lookup`` reads."""

    def __init__(self, held: set[int]) -> None:
        self.manager = HeldBlocks(held)


def main() -> None:
    rng = random.Random(0)
    cases = []
    for _ in range(3000):
        num_blocks, window, share = rng.randint(0, 40), rng.randint(1, 12), rng.random()
        held = [rng.random() < share for _ in range(num_blocks)]
        connector = Connector({i for i, h in enumerate(held) if h})
        end = OffloadingConnectorScheduler._sliding_window_lookup(connector, list(range(num_blocks)), window, None)
        cases.append((held, window, end))
    json.dump(cases, sys.stdout)


if __name__ == "__main__":
    main()
