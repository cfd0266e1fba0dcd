"""Bad input for ``--tier-inclusion`` (sim/config.py): an unknown value, or exclusive tiers with write-through
stores (an exclusive tier gets a block back only when the GPU evicts it); one line naming the option and its
value, exit 2, on ``simulate`` and ``sweep``, and InputError in the library."""

from __future__ import annotations

import pytest

from minipaged_cli.errors import InputError
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.workloads.presets import load_gpu, load_model
from tests.test_bad_input_sched import BURST, one_line_error

TIERS = ["--strategies", "paged", "--cpu-kv-memory", "1GiB"]


@pytest.mark.parametrize(("args", "needle"), [
    (["--tier-inclusion", "exclusive"],
     "--tier-inclusion: 'exclusive': an exclusive tier gets its blocks back only when the GPU evicts them: it needs "
     "--offload-policy on-eviction, not write-through"),
    (["--tier-inclusion", "exclusive", "--offload-policy", "write-through", "--disk-kv-memory", "4GiB"],
     "--tier-inclusion: 'exclusive': an exclusive tier gets its blocks back"),
    (["--tier-inclusion", "exlusive", "--offload-policy", "on-eviction"],
     "--tier-inclusion: 'exlusive': expected one of inclusive, exclusive (did you mean 'exclusive'?)"),
    (["--tier-inclusion", "", "--offload-policy", "on-eviction"],
     "--tier-inclusion: '': expected one of inclusive, exclusive"),
])
def test_simulate_refuses(args: list[str], needle: str) -> None:
    assert needle in one_line_error(["simulate", BURST, *TIERS, *args])


def test_sweep_refuses_an_exclusive_write_through_point() -> None:
    # Swept together, the write-through x exclusive point is refused before any replay runs
    line = one_line_error(["sweep", BURST, "--rates", "1", *TIERS, "--offload-policy", "write-through,on-eviction",
                           "--tier-inclusion", "inclusive,exclusive"])
    assert "--tier-inclusion: 'exclusive': an exclusive tier gets its blocks back only" in line


def test_sweep_refuses_an_unknown_inclusion() -> None:
    line = one_line_error(["sweep", BURST, "--rates", "1", *TIERS, "--tier-inclusion", "both"])
    assert "--tier-inclusion: 'both': expected one of inclusive, exclusive" in line


def test_library_refuses_exclusive_write_through() -> None:
    with pytest.raises(InputError, match="needs --offload-policy on-eviction"):
        SimConfig(load_model("qwen3-8b"), load_gpu("h200"), num_blocks=100, cpu_kv_blocks=10,
                  tier_inclusion="exclusive")
