"""Bad input for ``--tier-inclusion`` (sim/config.py): an unknown value, or exclusive tiers with write-through
stores (an exclusive tier gets a block back only when the GPU evicts it); one line naming the option (or the
``--config`` file and key) and its value, exit 2, on ``simulate`` and ``sweep``, and InputError in the library. A
sweep crossing both policies with both inclusions runs the combinations that exist."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from minipaged_cli.cli.main import app
from minipaged_cli.errors import InputError
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.workloads.presets import load_gpu, load_model
from tests.cli.test_bad_input_scheduling import BURST, one_line_error

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


def test_sweep_refuses_exclusive_tiers_with_no_on_eviction_point(tmp_path) -> None:
    line = one_line_error(["sweep", BURST, "--rates", "1", *TIERS, "--tier-inclusion", "inclusive,exclusive"])
    assert line.startswith("error: --tier-inclusion: 'inclusive,exclusive': exclusive tiers get their blocks back")
    assert "sweep them with --offload-policy on-eviction (it is write-through)" in line
    # from a --config file: the file and its key
    config = tmp_path / "sweep.yaml"
    config.write_text("tier_inclusion: [exclusive]\noffload_policy: write-through\n")
    line = one_line_error(["sweep", BURST, "--rates", "1", *TIERS, "--config", str(config)])
    assert line.startswith(f"error: {config}: tier_inclusion: 'exclusive': exclusive tiers")
    assert "sweep them with offload_policy on-eviction (it is write-through)" in line


def test_sweep_refuses_a_policy_with_no_point() -> None:
    line = one_line_error(["sweep", BURST, "--rates", "1", *TIERS, "--tier-inclusion", "exclusive",
                           "--offload-policy", "write-through,on-eviction"])
    assert line.startswith("error: --offload-policy: 'write-through,on-eviction': write-through has no point to "
                           "sweep: exclusive tiers need on-eviction (sweep --tier-inclusion inclusive too")


def test_sweep_crosses_the_policies_and_inclusions_less_exclusive_write_through(tmp_path) -> None:
    out = tmp_path / "sweep.json"
    result = CliRunner().invoke(app, ["sweep", BURST, "--rates", "1", *TIERS, "--offload-policy",
                                      "write-through,on-eviction", "--tier-inclusion", "inclusive,exclusive",
                                      "--workers", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    points = {(p["offload_policy"], p["tier_inclusion"]) for p in json.loads(out.read_text())["points"]}
    assert points == {("write-through", "inclusive"), ("on-eviction", "inclusive"), ("on-eviction", "exclusive")}


def test_sweep_refuses_an_unknown_inclusion() -> None:
    line = one_line_error(["sweep", BURST, "--rates", "1", *TIERS, "--tier-inclusion", "both"])
    assert "--tier-inclusion: 'both': expected one of inclusive, exclusive" in line


def test_library_refuses_exclusive_write_through() -> None:
    with pytest.raises(InputError, match="needs offload_policy=on-eviction"):
        SimConfig.of(load_model("qwen3-8b"), load_gpu("h200"), num_blocks=100, cpu_kv_blocks=10,
                     tier_inclusion="exclusive")
