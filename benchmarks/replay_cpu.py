"""One paged replay's CPU seconds, in a process of its own: ``simulate_bench.py --baseline-path`` and
``tiers_bench.py --baseline-path`` run it (``cpu_seconds``) against another checkout (``PYTHONPATH`` names which) to
time the same replay under each.

It imports only what every checkout since 0035b67 (the replay before vLLM v1's scheduling) has, so that it runs
unchanged against an older commit; a checkout without ``SimConfig.scheduler`` replays its only engine.

    PYTHONPATH=CHECKOUT python benchmarks/replay_cpu.py TRACE REQUESTS MAX_MODEL_LEN|0 PREFIX_CACHING(0|1) SCHEDULER

prints one JSON line: {"cpu_s": the replay's process time, "package": where minipaged_cli was imported from,
"completed": requests completed}.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import minipaged_cli
from minipaged_cli.sim import config as sim_config
from minipaged_cli.sim.config import SimConfig, num_blocks_for_memory
from minipaged_cli.sim.replay import replay
from minipaged_cli.workloads.presets import load_gpu, load_model
from minipaged_cli.workloads.readers import load_trace

# One capacity for every checkout, so that their times compare: Qwen3-8B on an H200, KV = 0.9 of its memory minus
# the weights in blocks of 16 (simulate's defaults until vLLM's release profiles, which size it as vLLM does).
GPU_MEMORY_UTILIZATION = getattr(sim_config, "DEFAULT_GPU_MEMORY_UTILIZATION", None) or 0.9
BLOCK_SIZE = 16


def default_config(max_model_len: int | None, prefix_caching: bool, scheduler: str) -> SimConfig:
    """``minipaged simulate``'s default capacity and engine; ``scheduler`` where the checkout has a choice."""
    model, gpu = load_model("qwen3-8b"), load_gpu("h200")
    fields = {field.name: field for field in dataclasses.fields(SimConfig)}
    kv_memory = int(GPU_MEMORY_UTILIZATION * gpu.memory_bytes - model.weight_bytes)
    engine = {"scheduler": scheduler} if "scheduler" in fields else {}
    return SimConfig(model, gpu, num_blocks=num_blocks_for_memory(kv_memory, model, BLOCK_SIZE), block_size=BLOCK_SIZE,
                     max_model_len=max_model_len, prefix_caching=prefix_caching, **engine)


def cpu_seconds(checkout: Path, trace: Path, num_requests: int, max_model_len: int | None, prefix_caching: bool,
                scheduler: str) -> float:
    """One paged replay's CPU seconds under ``checkout``'s package, in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    argv = [sys.executable, str(Path(__file__)), str(trace), str(num_requests), str(max_model_len or 0),
            str(int(prefix_caching)), scheduler]
    done = subprocess.run(argv, env=env, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"{checkout}: replay_cpu.py failed:\n{done.stderr}")
    result = json.loads(done.stdout)
    if Path(result["package"]) != checkout / "minipaged_cli":  # an installed copy shadowed PYTHONPATH
        raise RuntimeError(f"{checkout}: the replay imported {result['package']}")
    return result["cpu_s"]


def commit_of(checkout: Path) -> str:
    """``checkout``'s commit, abbreviated ("?" when it is not a git checkout)."""
    done = subprocess.run(["git", "-C", str(checkout), "log", "-1", "--format=%h"], capture_output=True, text=True)
    return done.stdout.strip() or "?"


def main() -> None:
    trace_path, num_requests, max_model_len, prefix_caching, scheduler = sys.argv[1:6]
    trace = load_trace(Path(trace_path)).limited(int(num_requests))
    config = default_config(int(max_model_len) or None, prefix_caching == "1", scheduler)
    start = time.process_time()
    metrics = replay(trace, config, "paged")
    cpu_s = time.process_time() - start
    print(json.dumps({"cpu_s": cpu_s, "package": str(Path(minipaged_cli.__file__).parent),
                      "completed": metrics.completed_requests}))


if __name__ == "__main__":
    main()
