"""The KV cache groups' block manager against vLLM 0.33.0's own hybrid ``KVCacheManager``, where the parity
harness's reference venv exists (``parity/setup_env.sh``; ``MINIPAGED_VLLM_VENV``): identical per-group block
tables (null blocks included), free-queue order, hit lengths and admission decisions after every operation of 240
random workloads over sliding-window + full-attention layouts, with and without prefix caching."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import VLLM_PYTHON, needs_vllm_venv


@needs_vllm_venv
def test_block_tables_free_queue_and_hits_agree_with_vllm_hybrid_manager() -> None:
    script = Path(__file__).with_name("vllm_hybrid_manager.py")
    done = subprocess.run([str(VLLM_PYTHON), str(script)], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "agreed with vLLM's hybrid KVCacheManager" in done.stdout
