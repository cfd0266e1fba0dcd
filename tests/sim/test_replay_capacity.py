"""The replay's capacity check (sim/replay.py ``check_capacity``): it stops at the first request a strategy places,
and names the smallest need when none fits."""

from __future__ import annotations

import pytest

from minipaged_cli.errors import InputError
from minipaged_cli.memory.allocators import Holding
from minipaged_cli.memory.strategies import STRATEGIES
from minipaged_cli.sim import replay as replay_module
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.workloads.presets import GpuSpec, ModelSpec
from minipaged_cli.workloads.trace import Request, Trace


def test_check_capacity_stops_at_the_first_request_a_strategy_places(
        monkeypatch: pytest.MonkeyPatch, tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    built = []

    class CountedHolding(Holding):
        def __init__(self, *args: int) -> None:
            super().__init__(*args)
            built.append(self)

    monkeypatch.setattr(replay_module, "Holding", CountedHolding)
    trace = Trace("many", tuple(Request(str(i), float(i), 10, 5) for i in range(5000)))
    replay_module.check_capacity(trace, SimConfig.of(tiny_model, clock_gpu, num_blocks=64, block_size=16), STRATEGIES)
    assert len(built) == len(STRATEGIES)  # every strategy places the first request: one holding each
    # The refusal still names the smallest need when none fits: 1,024 slots for max-reserve's max_model_len.
    with pytest.raises(InputError, match="max-reserve \\(the smallest needs 1024\\)"):
        replay_module.check_capacity(trace, SimConfig.of(tiny_model, clock_gpu, num_blocks=32, block_size=16),
                                     ("max-reserve",))
