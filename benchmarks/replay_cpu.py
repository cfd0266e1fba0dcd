"""One paged replay's CPU seconds, in a process of its own: ``simulate_bench.py --baseline-path`` and
``tiers_bench.py --baseline-path`` run it (``cpu_seconds``) against another checkout (``PYTHONPATH`` names which) to
time the same replay under each.

It imports only what every checkout since 0035b67 (the replay before vLLM v1's scheduling) has, so that it runs
unchanged against an older commit (one with flat ``SimConfig`` fields too); a checkout without ``SimConfig.scheduler``
replays its only engine.

    PYTHONPATH=CHECKOUT python benchmarks/replay_cpu.py TRACE REQUESTS MAX_MODEL_LEN|0 PREFIX_CACHING(0|1) SCHEDULER
        [COPIES [KV_BYTES|0]]

``COPIES`` > 1 replays the trace (its first ``REQUESTS``) that many times back to back (``repeated``:
``replay_scaling.py`` measures how the cost grows with it); ``KV_BYTES`` sets the KV memory instead of
``simulate``'s default. Prints one JSON line: {"cpu_s": the replay's process time, "package": where minipaged_cli
was imported from, "completed": requests completed, "requests": requests replayed, "loaded_rss_mb": the process's
resident memory with the trace loaded, just before the replay (Linux's /proc), "peak_rss_mb": its peak at the end}.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import minipaged_cli
from minipaged_cli.sim import config as sim_config
from minipaged_cli.sim.config import SimConfig, num_blocks_for_memory
from minipaged_cli.sim.replay import replay
from minipaged_cli.workloads.presets import load_gpu, load_model
from minipaged_cli.workloads.readers import load_trace
from minipaged_cli.workloads.trace import Trace

# One capacity for every checkout, so that their times compare: Qwen3-8B on an H200, KV = 0.9 of its memory minus
# the weights in blocks of 16 (simulate's defaults until vLLM's release profiles, which size it as vLLM does).
GPU_MEMORY_UTILIZATION = getattr(sim_config, "DEFAULT_GPU_MEMORY_UTILIZATION", None) or 0.9
BLOCK_SIZE = 16


def default_config(max_model_len: int | None, prefix_caching: bool, scheduler: str,
                   kv_memory: int | None = None) -> SimConfig:
    """``minipaged simulate``'s default capacity (or ``kv_memory`` bytes) and engine; ``scheduler`` where the
    checkout has a choice."""
    model, gpu = load_model("qwen3-8b"), load_gpu("h200")
    if kv_memory is None:
        kv_memory = int(GPU_MEMORY_UTILIZATION * gpu.memory_bytes - model.weight_bytes)
    num_blocks = num_blocks_for_memory(kv_memory, model, BLOCK_SIZE)
    settings = {"block_size": BLOCK_SIZE, "max_model_len": max_model_len, "prefix_caching": prefix_caching}
    if hasattr(SimConfig, "of"):  # settings by concern
        return SimConfig.of(model, gpu, num_blocks, scheduler=scheduler, **settings)
    fields = {field.name: field for field in dataclasses.fields(SimConfig)}
    engine = {"scheduler": scheduler} if "scheduler" in fields else {}
    return SimConfig(model, gpu, num_blocks=num_blocks, **settings, **engine)


def repeated(trace: Trace, copies: int) -> Trace:
    """``copies`` of the trace back to back: copy c arrives c * (span + mean gap) later than the first (each keeps
    the trace's arrival pattern; the next begins one mean gap after the last arrival), its ids suffixed ``#c``."""
    if copies == 1:
        return trace
    requests = trace.requests
    span = requests[-1].arrival_s - requests[0].arrival_s
    period = span + span / max(len(requests) - 1, 1)
    shifted = [dataclasses.replace(r, id=f"{r.id}#{c}", arrival_s=r.arrival_s + c * period)
               for c in range(copies) for r in requests]
    return dataclasses.replace(trace, requests=tuple(shifted))


def measure(checkout: Path, trace: Path, num_requests: int, max_model_len: int | None, prefix_caching: bool,
            scheduler: str, copies: int = 1, kv_memory: int | None = None) -> dict[str, Any]:
    """One paged replay under ``checkout``'s package, in a fresh process: the JSON line ``main`` prints."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    argv = [sys.executable, str(Path(__file__)), str(trace), str(num_requests), str(max_model_len or 0),
            str(int(prefix_caching)), scheduler, str(copies), str(kv_memory or 0)]
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{checkout}: replay_cpu.py failed:\n{done.stderr}")
    result = json.loads(done.stdout)
    if Path(result["package"]) != checkout / "minipaged_cli":  # an installed copy shadowed PYTHONPATH
        raise RuntimeError(f"{checkout}: the replay imported {result['package']}")
    return result


def cpu_seconds(checkout: Path, trace: Path, num_requests: int, max_model_len: int | None, prefix_caching: bool,
                scheduler: str) -> float:
    """One paged replay's CPU seconds under ``checkout``'s package, in a fresh process."""
    return measure(checkout, trace, num_requests, max_model_len, prefix_caching, scheduler)["cpu_s"]


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def rss_mb() -> float:
    """This process's resident memory now, MiB (not its peak: the trace's parsing may have peaked above it)."""
    resident_pages = int(Path("/proc/self/statm").read_text().split()[1])
    return resident_pages * resource.getpagesize() / 2**20


def commit_of(checkout: Path) -> str:
    """``checkout``'s commit, abbreviated ("?" when it is not a git checkout)."""
    done = subprocess.run(["git", "-C", str(checkout), "log", "-1", "--format=%h"], capture_output=True, text=True)
    return done.stdout.strip() or "?"


def main() -> None:
    trace_path, num_requests, max_model_len, prefix_caching, scheduler = sys.argv[1:6]
    copies, kv_memory = (int(arg) for arg in sys.argv[6:8]) if len(sys.argv) > 6 else (1, 0)
    trace = repeated(load_trace(Path(trace_path)).limited(int(num_requests)), copies)
    config = default_config(int(max_model_len) or None, prefix_caching == "1", scheduler, kv_memory or None)
    loaded_rss_mb = rss_mb()
    start = time.process_time()
    metrics = replay(trace, config, "paged")
    cpu_s = time.process_time() - start
    print(json.dumps({"cpu_s": cpu_s, "package": str(Path(minipaged_cli.__file__).parent),
                      "completed": metrics.completed_requests, "requests": trace.num_requests,
                      "loaded_rss_mb": loaded_rss_mb, "peak_rss_mb": peak_rss_mb()}))


if __name__ == "__main__":
    main()
