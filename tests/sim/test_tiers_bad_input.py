"""Bad input for the prefix cache's tiers below the GPU: one line and exit 2 on the command line, InputError in the
library."""

from __future__ import annotations

import dataclasses

import pytest
from typer.testing import CliRunner

from minipaged_cli.cli.main import app
from minipaged_cli.errors import InputError
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.workloads.presets import load_gpu, load_model
from tests.cli.test_bad_input_scheduling import BURST, one_line_error
from tests.conftest import ROOT


@pytest.mark.parametrize(("args", "needle"), [
    (["--cpu-kv-memory", "-1GiB"], "--cpu-kv-memory: '-1GiB': expected a size"),
    (["--cpu-kv-memory", "nan"], "--cpu-kv-memory: 'nan': expected a size"),
    (["--cpu-kv-memory", "inf"], "--cpu-kv-memory: 'inf': expected a size"),
    (["--cpu-kv-memory", "1KiB", "--block-size", "16"], "--cpu-kv-memory: '1KiB': holds no block of 16 tokens"),
    (["--cpu-kv-memory", "1GiB", "--disk-kv-memory", "-5GB"], "--disk-kv-memory: '-5GB': expected a size"),
    (["--disk-kv-memory", "1TiB"], "--disk-kv-memory: a disk tier needs a host tier"),
    (["--cpu-kv-memory", "1GiB", "--offload-policy", "write-back"],
     "--offload-policy: 'write-back': expected one of write-through, on-eviction"),
    (["--cpu-kv-memory", "1GiB", "--tier-eviction", "lfu"], "--tier-eviction: 'lfu': expected one of lru, arc"),
    (["--cpu-kv-memory", "1GiB", "--no-prefix-caching"], "--cpu-kv-memory: the host tier holds prefix-cache"),
])
def test_tier_options(args: list[str], needle: str) -> None:
    assert needle in one_line_error(["simulate", BURST, *args])


def test_zero_is_no_tier() -> None:
    result = CliRunner().invoke(app, ["simulate", BURST, "--strategies", "paged", "--cpu-kv-memory", "0"])
    assert result.exit_code == 0, result.output
    assert "tiers below the GPU" not in result.output


@pytest.mark.parametrize(("field", "value"), [
    ("host_bandwidth_efficiency", 0.0), ("host_bandwidth_efficiency", 1.5), ("host_bandwidth_efficiency", float("nan")),
    ("disk_read_bytes_per_s", -1.0), ("disk_write_bytes_per_s", float("inf")), ("disk_read_bytes_per_s", 0.0),
])
def test_link_fields_of_a_gpu(field: str, value: float) -> None:
    with pytest.raises(InputError, match=field):
        dataclasses.replace(load_gpu("h200"), **{field: value})


def test_link_fields_in_a_gpu_yaml(tmp_path) -> None:
    text = (ROOT / "configs" / "gpus" / "h200.yaml").read_text().replace("disk_read_bytes_per_s: 7.45e+9",
                                                                         "disk_read_bytes_per_s: -7.45e+9")
    (tmp_path / "mine.yaml").write_text(text)
    line = one_line_error(["simulate", BURST, "--gpu", str(tmp_path / "mine.yaml"), "--cpu-kv-memory", "1GiB"])
    assert "disk_read_bytes_per_s" in line and "-7450000000.0" in line


def test_negative_tier_blocks_in_the_library() -> None:
    with pytest.raises(InputError, match="cpu_kv_blocks"):
        SimConfig.of(load_model("qwen3-8b"), load_gpu("h200"), num_blocks=10, cpu_kv_blocks=-1)
