"""The prefix cache's tiers under a model with sliding-window layers (sim/tiers.py over memory/hybrid.py): tier
sizes in the pool's blocks, and vLLM 0.33.0's OffloadingConnector, which supports the hybrid KV cache manager
(``SupportsHMA``) and offloads per KV cache group: a full-attention group's blocks from the GPU's hit on, a
sliding-window group's only within the window at the hit's end."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from minipaged_cli.cli.main import app
from tests.test_bad_input_sched import BURST

GEMMA_ALL_LAYERS_BLOCK = 16 * 507_904  # gemma-3-27b: 62 layers of K/V, 507,904 B a token, 8,126,464 B a block


def test_a_tier_size_counts_the_blocks_the_replay_uses() -> None:
    # Without the hybrid manager a gemma-3-27b block holds all 62 layers (7.75 MiB); 1 GiB of host memory holds 132
    # of them. The size was converted with the hybrid manager's 10-layer pages (1.25 MiB): 819 blocks, 6.2x the
    # memory given.
    result = CliRunner().invoke(app, ["simulate", BURST, "--strategies", "paged", "--model", "gemma-3-27b",
                                      "--no-hybrid-kv", "--kv-memory", "8GiB", "--max-model-len", "4096",
                                      "--cpu-kv-memory", "1GiB", "--json", "-"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout[result.stdout.index("{"):])
    assert document["config"]["cpu_kv_blocks"] == 2**30 // GEMMA_ALL_LAYERS_BLOCK == 132
