"""The block pool against vLLM 0.33.0's own ``BlockPool``, where the parity harness's reference venv exists
(``parity/setup_env.sh``; ``MINIPAGED_VLLM_VENV``, default ~/.cache/minipaged/vllm-0.33.0): identical block ids
and free-queue order after every operation of 600 random workloads, with and without prefix caching."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests.conftest import VLLM_PYTHON, needs_vllm_venv


@needs_vllm_venv
def test_block_ids_and_free_queue_order_agree_with_vllm() -> None:
    script = Path(__file__).with_name("vllm_block_pool.py")
    done = subprocess.run([str(VLLM_PYTHON), str(script)], capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "agreed with vLLM's BlockPool" in done.stdout
