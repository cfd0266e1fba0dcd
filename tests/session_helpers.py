"""What the session and client tests share: a model and a GPU whose every step lasts 1 ms, and a replay whose
clients (``sim/clients.py``) can be read afterwards."""

from __future__ import annotations

from minipaged_cli.sim.accounting import StrategyMetrics
from minipaged_cli.sim.clients import OPEN_LOOP, Arrivals, Clients
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.replay import Replay
from minipaged_cli.workloads.presets import GpuSpec, ModelSpec
from minipaged_cli.workloads.trace import Trace

MODEL = ModelSpec(name="tiny", num_layers=1, hidden_size=8, intermediate_size=8, num_q_heads=1, num_kv_heads=1,
                  head_dim=8, vocab_size=8, tie_word_embeddings=True, gated_mlp=True, dtype="float16",
                  max_model_len=8192)
CLOCK_GPU = GpuSpec(name="clock", memory_bytes=1e12, hbm_bandwidth_bytes_per_s=1e30, peak_flops=1e30,
                    step_overhead_s=0.001)


def run(trace: Trace, *, clients: Clients = OPEN_LOOP, bulk: bool = True,
        **options: object) -> tuple[StrategyMetrics, Arrivals]:
    """Replay under ``paged`` (block size 16 unless given, invariants checked); the metrics and the clients."""
    options.setdefault("block_size", 16)
    options.setdefault("num_blocks", 1000)
    config = SimConfig.of(MODEL, CLOCK_GPU, check_invariants=True, clients=clients, **options)  # type: ignore[arg-type]
    replay = Replay(trace, config, config.allocator("paged"), bulk, None)
    metrics = replay.run()
    assert metrics.invariant_violations == 0
    return metrics, replay.scheduler.arrivals
