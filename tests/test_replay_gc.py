"""A replay pauses Python's cyclic garbage collector (``sim/replay.py cyclic_gc_paused``): off while the steps run,
as it was once the replay returns or fails; on throughout a replay that executes its steps (``on_step``: ``minipaged
run``'s tensors)."""

from __future__ import annotations

import gc

import pytest

from minipaged_cli.memory.allocators import Allocator
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import StepWork, replay
from minipaged_cli.workloads.presets import GpuSpec, ModelSpec
from minipaged_cli.workloads.trace import Request, make_trace


def _replay(model: ModelSpec, gpu: GpuSpec, on_step=None, progress=None) -> None:
    trace = make_trace("t", [Request("a", 0.0, 40, 3), Request("b", 0.0, 20, 2)], source="test")
    replay(trace, SimConfig(model, gpu, num_blocks=64, block_size=16, max_model_len=256), "paged", on_step=on_step,
           progress=progress)


@pytest.mark.parametrize("enabled_before", [True, False])
def test_the_collector_is_off_during_the_steps_and_as_before_after(tiny_model: ModelSpec, clock_gpu: GpuSpec,
                                                                    enabled_before: bool) -> None:
    seen: list[bool] = []

    def record(num_done: int) -> None:
        seen.append(gc.isenabled())

    was = gc.isenabled()
    (gc.enable if enabled_before else gc.disable)()
    try:
        _replay(tiny_model, clock_gpu, progress=record)
        assert seen and not any(seen)
        assert gc.isenabled() == enabled_before
    finally:
        (gc.enable if was else gc.disable)()


def test_the_collector_stays_on_while_a_data_plane_executes_the_steps(tiny_model: ModelSpec,
                                                                      clock_gpu: GpuSpec) -> None:
    seen: list[bool] = []

    def execute(work: StepWork, allocator: Allocator) -> None:
        seen.append(gc.isenabled())

    assert gc.isenabled()
    _replay(tiny_model, clock_gpu, on_step=execute)
    assert seen and all(seen)
    assert gc.isenabled()


def test_a_failing_replay_turns_the_collector_back_on(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    def fail(num_done: int) -> None:
        raise RuntimeError("a progress display failed")

    assert gc.isenabled()
    with pytest.raises(RuntimeError, match="progress display"):
        _replay(tiny_model, clock_gpu, progress=fail)
    assert gc.isenabled()
