"""Bad input for the host tier under vLLM v0 (swap space and prefix-cache tier, sim/config.py): one line and exit 2
on the command line naming the option and its value, InputError in the library."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from minipaged_cli.cli.main import app
from minipaged_cli.errors import InputError
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.workloads.presets import load_gpu, load_model
from tests.cli.test_bad_input_scheduling import BURST, one_line_error

V0_SWAP = ["--scheduler", "v0", "--preemption", "swap"]


@pytest.mark.parametrize(("args", "needle"), [
    ([*V0_SWAP, "--cpu-blocks", "100", "--cpu-kv-memory", "1GiB"],
     "--cpu-blocks: 100: under --scheduler v0 the host tier is the swap space, and --cpu-kv-memory holds 455 blocks"),
    (["--scheduler", "v0", "--cpu-kv-memory", "1GiB"],
     "--cpu-kv-memory (blocks): 455: under --scheduler v0 the host tier is the swap space"),
    ([*V0_SWAP, "--cpu-kv-memory", "1GiB", "--disk-kv-memory", "1TiB"],
     "--disk-kv-memory (blocks): 466033: a disk tier under --scheduler v0 is not modelled"),
    (["--scheduler", "v0", "--prefix-caching", "--cpu-kv-memory", "1GiB", "--layerwise-loads"],
     "--layerwise-loads: True: under --scheduler v0 a load from the host tier ends before the step's forward"),
    (V0_SWAP, "--cpu-blocks: 0: swap needs a CPU pool; set --cpu-blocks or --cpu-kv-memory"),
    ([*V0_SWAP, "--cpu-kv-memory", "-1GiB"], "--cpu-kv-memory: '-1GiB': expected a size"),
    ([*V0_SWAP, "--cpu-kv-memory", "nan"], "--cpu-kv-memory: 'nan': expected a size"),
    ([*V0_SWAP, "--cpu-kv-memory", "1KiB"], "--cpu-kv-memory: '1KiB': holds no block of 16 tokens"),
])
def test_v0_host_tier_options(args: list[str], needle: str) -> None:
    # 1 GiB of Qwen3-8B's KV in blocks of 16 tokens (2,359,296 B): 455 blocks; 1 TiB: 466,033.
    assert needle in one_line_error(["simulate", BURST, "--strategies", "paged", *args])


def test_sweep_refuses_two_swap_spaces() -> None:
    line = one_line_error(["sweep", BURST, "--rates", "1", *V0_SWAP, "--cpu-blocks", "100", "--cpu-kv-memory",
                           "1GiB,2GiB"])
    assert "--cpu-blocks: 100: under --scheduler v0 the host tier is the swap space" in line


def test_the_same_swap_space_twice_is_one() -> None:
    config = SimConfig.of(load_model("qwen3-8b"), load_gpu("h200"), num_blocks=100, scheduler="v0",
                          preemption="swap", cpu_blocks=455, cpu_kv_blocks=455)
    assert config.swap_blocks == 455


def test_library_refuses_swap_without_room() -> None:
    with pytest.raises(InputError, match="swap needs a CPU pool"):
        SimConfig.of(load_model("qwen3-8b"), load_gpu("h200"), num_blocks=100, scheduler="v0", preemption="swap")


def test_run_names_only_options_run_has() -> None:
    # `run` has no --prefix-caching (its v0 never caches): its refusal of a host tier that would hold nothing
    # must not send the user to an option it lacks.
    line = one_line_error(["run", BURST, "--scheduler", "v0", "--cpu-kv-memory", "1GiB", "--block-size", "16"])
    assert "--cpu-kv-memory (blocks): 455" in line
    run_help = CliRunner().invoke(app, ["run", "--help"], terminal_width=200).output
    assert set(re.findall(r"--[a-z][a-z-]+", line)) <= set(re.findall(r"--[a-z][a-z-]+", run_help))
