"""Every default minipaged attributes to vLLM (``sim/vllm_releases.py``), read again from the installed wheel of
the parity venv (``parity/setup_env.sh``; ``MINIPAGED_VLLM_VERSION`` picks the release, 0.34.0 by default):
a release that changes one fails here instead of waiting for an audit. Skipped without the venv, like the other
parity tests."""

from __future__ import annotations

import functools
import json
import os
import subprocess
from pathlib import Path

from minipaged_cli.sim.kv_sizing import KV_CACHE_MARGIN_FLOOR_BYTES, KV_CACHE_MARGIN_FRACTION, extensible_kv_bytes
from minipaged_cli.sim.vllm_releases import FLASHMLA_BLOCK_SIZE, vllm_release
from minipaged_cli.workloads.presets import load_gpu
from tests.conftest import VLLM_PYTHON, needs_vllm_venv

GIB = 2**30


@functools.cache  # (one run of the wheel for the three tests)
def _wheel_defaults() -> dict:
    script = Path(__file__).with_name("vllm_defaults.py")
    env = {k: v for k, v in os.environ.items() if k != "VLLM_TARGET_DEVICE"}  # (no platform: parity/README.md)
    done = subprocess.run([str(VLLM_PYTHON), str(script)], capture_output=True, text=True, timeout=600, check=False,
                          env={**env, "VLLM_LOGGING_LEVEL": "ERROR"})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@needs_vllm_venv
def test_the_release_table_matches_the_installed_wheel() -> None:
    wheel = _wheel_defaults()
    release = vllm_release(wheel["version"])  # the venv's release must be one minipaged supports
    assert release.default_block_size == wheel["default_block_size"]
    assert release.extensible_kv_cache == wheel["has_extensible_kv_cache"]  # on CUDA whenever the field exists
    expected_utilization = 1.0 if release.extensible_kv_cache else wheel["gpu_memory_utilization"]
    assert release.gpu_memory_utilization == expected_utilization
    if release.extensible_kv_cache:  # unset, resolved by resolved_gpu_memory_utilization
        assert wheel["gpu_memory_utilization"] is None
    assert release.estimate_gpu_memory_utilization == wheel["default_gpu_memory_utilization"]
    for name in ("watermark", "enable_prefix_caching", "prefix_caching_hash_algo", "enable_chunked_prefill",
                 "long_prefill_token_threshold", "async_scheduling", "cache_aware_admission_window",
                 "cache_aware_admission_threshold", "has_max_num_inflight_kv_loads"):
        assert getattr(release, name) == wheel[name], name
    assert wheel["max_num_inflight_kv_loads"] is None  # no cap by default, where the option exists
    for gpu_name, limits in wheel["batch_defaults"].items():
        if gpu_name == "b200":  # no preset: the tier is checked on its threshold
            assert release.batch_tiers[0].min_memory_gib == 160 and tuple(limits) == (
                release.batch_tiers[0].max_num_batched_tokens, release.batch_tiers[0].max_num_seqs)
            continue
        assert list(release.batch_defaults(load_gpu(gpu_name))) == limits, gpu_name


@needs_vllm_venv
def test_the_backend_block_size_rule_matches_the_backends() -> None:
    wheel = _wheel_defaults()
    # full attention: FLASH_ATTN takes any multiple of 16 and keeps the platform's default
    assert wheel["flash_attn_sizes"] == [16]
    assert wheel["flash_attn_preferred"] == {"16": 16, "64": 64}
    # MLA on Hopper: FLASH_ATTN_MLA (multiples of 16) unless the KV cache is fp8, which only FLASHMLA (64) takes
    assert wheel["flash_attn_mla"]["sizes"] == [16] and "fp8" not in wheel["flash_attn_mla"]["kv_cache_dtypes"]
    assert wheel["flash_mla"]["sizes"] == [FLASHMLA_BLOCK_SIZE] and "fp8" in wheel["flash_mla"]["kv_cache_dtypes"]
    # MLA before Hopper: TRITON_MLA, multiples of 16, fp8 too
    assert wheel["triton_mla"]["sizes"] == [16] and "fp8" in wheel["triton_mla"]["kv_cache_dtypes"]


@needs_vllm_venv
def test_the_extensible_sizing_matches_vllms_function() -> None:
    wheel = _wheel_defaults()
    if wheel["extensible"] is None:  # a release without the extensible KV cache
        assert not vllm_release(wheel["version"]).extensible_kv_cache
        return
    assert wheel["peak_includes_graph_estimate"]  # the transient peak kept free counts the graphs' estimate
    assert wheel["extensible"]["margin_floor_bytes"] == KV_CACHE_MARGIN_FLOOR_BYTES
    assert wheel["extensible"]["margin_fraction"] == KV_CACHE_MARGIN_FRACTION
    # vLLM's measure_kv_cache_bytes on 139 GiB free at start, 120 free after warmup, nothing committed, a 140 GiB
    # budget, a 3 GiB transient peak; minipaged's rule on the same figures (resident: 139 - 120 = 19 GiB)
    assert wheel["extensible"]["sample"] == extensible_kv_bytes(140 * GIB, 139 * GIB, 19 * GIB, 3 * GIB)
