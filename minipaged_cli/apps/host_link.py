"""``minipaged calibrate``'s host link: copies between the device and host memory, timed each way by copy size,
and the GPU YAML that hands the measured bandwidth to the simulator (``--gpu GPU.yaml``: the host tier's link and
swapping read ``host_bandwidth_bytes_per_s``)."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
import torch
import yaml

from minipaged_cli.apps.calibrate import device_name
from minipaged_cli.dataplane.backends import WARMUP_CALLS
from minipaged_cli.workloads.presets import GpuSpec

# Copy sizes of the host-link measurement: a 16-token block of one layer's K of Qwen3-8B is 32 KiB, one block of
# every layer's K and V 2.3 MiB; a GPU reaches its link's bandwidth in copies of a few MiB.
LINK_SIZES = (4 * 2**10, 64 * 2**10, 2**20, 16 * 2**20, 256 * 2**20)
QUICK_LINK_SIZES = (4 * 2**10, 64 * 2**10, 2**20, 16 * 2**20)
LINK_DIRECTIONS = ("host_to_device", "device_to_host")


@dataclass(frozen=True)
class HostLink:
    """Seconds of one copy between the device and host memory, by copy size (bytes), median of the repeats:
    ``seconds[(direction, pinned)]`` for each of ``LINK_DIRECTIONS``, from pinned host memory (what offloading
    and swapping use on a GPU) and pageable memory (``pinned`` False; a GPU's driver stages it through a pinned
    bounce buffer). On a CPU device both ends are host memory: the copies are memcpy, not a PCIe link, and there
    is no pinned memory to measure."""

    device: str
    sizes: tuple[int, ...]
    seconds: dict[tuple[str, bool], tuple[float, ...]]

    @property
    def is_pcie(self) -> bool:
        return not self.device.startswith("cpu")

    def gbps(self, direction: str, pinned: bool) -> list[float]:
        return [size / s / 1e9 for size, s in zip(self.sizes, self.seconds[(direction, pinned)], strict=True)]

    def to_dict(self) -> dict[str, object]:
        """``--json``'s: GB/s per size, each direction and memory kind measured."""
        return {"device": self.device, "is_pcie": self.is_pcie, "sizes": list(self.sizes),
                "bandwidth_bytes_per_s": self.bandwidth_bytes_per_s,
                **{f"{d}_{'pinned' if p else 'pageable'}_gbps": [round(g, 3) for g in self.gbps(d, p)]
                   for d, p in self.seconds}}

    @property
    def bandwidth_bytes_per_s(self) -> float:
        """What the simulator's ``host_bandwidth_bytes_per_s`` takes: one direction at the largest copy, from the
        memory offloading uses (pinned on a GPU), the slower direction."""
        pinned = self.is_pcie
        return min(self.sizes[-1] / self.seconds[(d, pinned)][-1] for d in LINK_DIRECTIONS)


def measure_host_link(device: torch.device, sizes: tuple[int, ...], repeat: int) -> HostLink:
    """Time ``repeat`` copies of each size (after a warm-up) each way between ``device`` and host memory:
    CUDA events around the copy on a GPU, the host clock on a CPU."""
    on_cuda = device.type == "cuda"
    seconds = {}
    for pinned in (True, False) if on_cuda else (False,):
        for direction in LINK_DIRECTIONS:
            times = []
            for size in sizes:
                host = torch.ones(size, dtype=torch.uint8, pin_memory=pinned)
                on_device = torch.ones(size, dtype=torch.uint8, device=device)
                source, target = (host, on_device) if direction == "host_to_device" else (on_device, host)
                times.append(_median_copy_seconds(target, source, repeat, on_cuda))
            seconds[(direction, pinned)] = tuple(times)
    return HostLink(device=device_name(device), sizes=tuple(sizes), seconds=seconds)


def _median_copy_seconds(target: torch.Tensor, source: torch.Tensor, repeat: int, on_cuda: bool) -> float:
    times = []
    for attempt in range(WARMUP_CALLS + repeat):  # the warm-up calls first, untimed
        if on_cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            target.copy_(source, non_blocking=True)
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end) / 1e3
        else:
            started = time.perf_counter()
            target.copy_(source)
            elapsed = time.perf_counter() - started
        if attempt >= WARMUP_CALLS:
            times.append(elapsed)
    return float(np.median(times))


def gpu_yaml(gpu: GpuSpec, link: HostLink) -> str:
    """``gpu``'s preset as a GPU YAML (``--gpu PATH`` reads it), its host link replaced by the measured one: the
    bandwidth is what the copies achieved, so its efficiency is 1 (the host tier's link is their product)."""
    fields = {**asdict(gpu), "host_bandwidth_bytes_per_s": float(f"{link.bandwidth_bytes_per_s:.4g}"),
              "host_bandwidth_efficiency": 1.0}
    what = "pinned memory over PCIe" if link.is_pcie else "memcpy on the CPU, not a PCIe link"
    header = (f"# {gpu.name}, its host link measured by minipaged calibrate on {link.device}: the slower direction "
              f"of {link.sizes[-1]:,}-byte copies, {what}.\n")
    return header + yaml.safe_dump(fields, sort_keys=False)
