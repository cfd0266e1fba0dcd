"""calibrate's host link (apps/host_link.py measure_host_link, gpu_yaml): copies each way by size, and the GPU
YAML that carries the measured link to the simulator."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch
from typer.testing import CliRunner

from minipaged_cli.apps.host_link import LINK_DIRECTIONS, HostLink, gpu_yaml, measure_host_link
from minipaged_cli.cli.main import app
from minipaged_cli.workloads.presets import load_gpu
from tests.conftest import ROOT

VIDUR = str(ROOT / "tests" / "data" / "vidur_h100_llama-2-7b_mlp.csv")


def test_on_a_cpu_the_link_is_memcpy_of_pageable_memory_both_ways() -> None:
    link = measure_host_link(torch.device("cpu"), (4096, 2**20), repeat=2)
    assert not link.is_pcie and link.sizes == (4096, 2**20)
    assert set(link.seconds) == {(d, False) for d in LINK_DIRECTIONS}  # no pinned memory without a GPU
    assert all(s > 0 for times in link.seconds.values() for s in times)
    slower = max(link.seconds[(d, False)][-1] for d in LINK_DIRECTIONS)
    assert link.bandwidth_bytes_per_s == 2**20 / slower


def test_the_gpu_yaml_is_the_preset_with_the_measured_link(tmp_path: Path) -> None:
    seconds = {("host_to_device", True): (1e-4, 2**28 / 55e9), ("device_to_host", True): (1e-4, 2**28 / 50e9),
               ("host_to_device", False): (1e-3, 1.0), ("device_to_host", False): (1e-3, 1.0)}
    link = HostLink(device="NVIDIA H200", sizes=(2**20, 2**28), seconds=seconds)
    path = tmp_path / "h200-measured.yaml"
    path.write_text(gpu_yaml(load_gpu("h200"), link))
    # the slower pinned direction at the largest copy; pageable memory is not what offloading uses
    measured = load_gpu(str(path))
    assert measured == dataclasses.replace(load_gpu("h200"), host_bandwidth_bytes_per_s=50e9,
                                           host_bandwidth_efficiency=1.0)
    assert measured.host_link_bytes_per_s == 50e9  # what the host tier's copies take: the measurement itself
    assert "pinned memory over PCIe" in path.read_text()


def test_calibrate_writes_the_link_to_the_json_and_the_gpu_yaml(tmp_path: Path) -> None:
    gpu_out = tmp_path / "gpu.yaml"
    result = CliRunner().invoke(app, ["calibrate", str(tmp_path / "cal.yaml"), "--model", "qwen3-0.6b", "--device",
                                      "cpu", "--quick", "--repeat", "1", "--gpu-out", str(gpu_out), "--json", "-"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout[result.stdout.index("{"):])
    link = document["host_link"]
    assert link["is_pcie"] is False and len(link["host_to_device_pageable_gbps"]) == len(link["sizes"])
    assert load_gpu(str(gpu_out)).host_bandwidth_bytes_per_s == float(f"{link['bandwidth_bytes_per_s']:.4g}")
    assert "memcpy, not a PCIe link" in result.stderr


def test_gpu_out_needs_the_link_measured(tmp_path: Path) -> None:
    for extra in (["--from-vidur", VIDUR], ["--device", "cpu", "--no-host-link"]):
        result = CliRunner().invoke(app, ["calibrate", str(tmp_path / "cal.yaml"), "--model", "llama-2-7b", "--gpu",
                                          "h100", "--gpu-out", str(tmp_path / "gpu.yaml"), *extra])
        assert result.exit_code == 2, result.output
        assert "--gpu-out" in result.output and "needs the host link measured" in result.output
