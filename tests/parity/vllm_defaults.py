"""Run with the vLLM reference venv's python (``tests/parity/test_vllm_defaults.py`` does): every default that minipaged
attributes to vLLM, read from the installed wheel's own code, printed as one JSON document. Nothing of minipaged
is imported here: the comparison is the test's.

Run without ``VLLM_TARGET_DEVICE`` on a machine without an accelerator (vLLM's ``UnspecifiedPlatform``); where a
default depends on the device, the device's answers are patched in and vLLM's own function computes the rest.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import json
import logging
import re
from pathlib import Path
from unittest import mock

import vllm
from vllm.config import CacheConfig, SchedulerConfig
from vllm.engine.arg_utils import EngineArgs
from vllm.platforms import current_platform
from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend

GIB = 2**30


def field_defaults(cls: type) -> dict[str, object]:
    # (a pydantic Field keeps its default inside)
    return {f.name: getattr(f.default, "default", f.default) for f in dataclasses.fields(cls)
            if f.default is not dataclasses.MISSING}


def batch_defaults(memory_gib: float, name: str) -> list[int]:
    """``vllm serve``'s (OPENAI_API_SERVER) max_num_batched_tokens and max_num_seqs on a device of this memory and
    name, from vLLM's own EngineArgs.get_batch_defaults."""
    from vllm.usage.usage_lib import UsageContext

    with mock.patch.object(current_platform, "get_device_total_memory", return_value=int(memory_gib * GIB)), \
            mock.patch.object(current_platform, "get_device_name", return_value=name), \
            mock.patch.object(current_platform, "is_device_capability", return_value=False):
        tokens, seqs = EngineArgs.get_batch_defaults(world_size=1)
    return [tokens[UsageContext.OPENAI_API_SERVER], seqs[UsageContext.OPENAI_API_SERVER]]


def sizes(backend: type) -> list[object]:
    return [getattr(s, "base", s) for s in backend.get_supported_kernel_block_sizes()]


def backend_source(module: str, cls: str) -> dict[str, object]:
    """What an attention backend's class says of its kernels, read from its source: the MLA backends import
    CUDA-only kernels, so they cannot be imported here. The block sizes its ``get_supported_kernel_block_sizes``
    returns (``MultipleOf(n)`` as n) and its ``supported_kv_cache_dtypes``."""
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin is not None, module
    tree = ast.parse(Path(spec.origin).read_text())
    found: dict[str, object] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.ClassDef) and node.name == cls):
            continue
        for item in node.body:
            if isinstance(item, ast.FunctionDef) and item.name == "get_supported_kernel_block_sizes":
                returned = next(n.value for n in ast.walk(item) if isinstance(n, ast.Return))
                assert isinstance(returned, ast.List), ast.unparse(returned)
                found["sizes"] = [e.args[0].value if isinstance(e, ast.Call) else e.value  # type: ignore[attr-defined]
                                  for e in returned.elts]
            if isinstance(item, ast.AnnAssign) and ast.unparse(item.target) == "supported_kv_cache_dtypes":
                found["kv_cache_dtypes"] = ast.literal_eval(item.value)  # type: ignore[arg-type]
    return found


def resolved_async_scheduling() -> bool:
    """SchedulerConfig.async_scheduling as VllmConfig resolves it for a plain generative model (the tiny Qwen3 of
    the parity harness) on the default executor."""
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig

    model = ModelConfig(model=str(Path(__file__).resolve().parents[2] / "parity" / "tiny-qwen3"),
                        skip_tokenizer_init=True, dtype="float16", seed=0, max_model_len=4096)
    config = VllmConfig(model_config=model, device_config=DeviceConfig(device="cpu"),
                        scheduler_config=SchedulerConfig(max_model_len=4096, is_encoder_decoder=False))
    return bool(config.scheduler_config.async_scheduling)


def main() -> None:
    logging.getLogger("vllm").setLevel(logging.ERROR)
    cache, scheduler = field_defaults(CacheConfig), field_defaults(SchedulerConfig)
    document = {
        "version": vllm.__version__,
        "default_block_size": CacheConfig.DEFAULT_BLOCK_SIZE,
        "gpu_memory_utilization": cache["gpu_memory_utilization"],
        "default_gpu_memory_utilization": getattr(CacheConfig, "DEFAULT_GPU_MEMORY_UTILIZATION",
                                                  cache["gpu_memory_utilization"]),
        "has_extensible_kv_cache": "enable_extensible_kv_cache" in {f.name for f in dataclasses.fields(CacheConfig)},
        "enable_prefix_caching": cache["enable_prefix_caching"],
        "prefix_caching_hash_algo": cache["prefix_caching_hash_algo"],
        "watermark": scheduler["watermark"],
        "enable_chunked_prefill": scheduler["enable_chunked_prefill"],
        "long_prefill_token_threshold": scheduler["long_prefill_token_threshold"],
        "async_scheduling": resolved_async_scheduling(),
        "cache_aware_admission_window": scheduler.get("cache_aware_admission_window"),
        "cache_aware_admission_threshold": scheduler.get("cache_aware_admission_threshold"),
        "has_max_num_inflight_kv_loads": "max_num_inflight_kv_loads" in scheduler,
        "max_num_inflight_kv_loads": scheduler.get("max_num_inflight_kv_loads"),
        "batch_defaults": {"b200": batch_defaults(178.35, "NVIDIA B200"),
                           "h200": batch_defaults(139.81, "NVIDIA H200"),
                           "h100": batch_defaults(79.22, "NVIDIA H100 80GB HBM3"),
                           "a100-80gb": batch_defaults(79.15, "NVIDIA A100-SXM4-80GB"),
                           "a100-40gb": batch_defaults(39.39, "NVIDIA A100-SXM4-40GB")},
        # the backends CUDA picks on an A100 and Hopper, and the block sizes their kernels take
        "flash_attn_sizes": sizes(FlashAttentionBackend),
        "flash_attn_preferred": {str(size): FlashAttentionBackend.get_preferred_block_size(size)
                                 for size in (16, 64)},
        "flash_attn_mla": backend_source("vllm.v1.attention.backends.mla.flashattn_mla", "FlashAttnMLABackend"),
        "flash_mla": backend_source("vllm.v1.attention.backends.mla.flashmla", "FlashMLABackend"),
        "triton_mla": backend_source("vllm.v1.attention.backends.mla.triton_mla", "TritonMLABackend"),
    }
    # what the worker keeps free as the transient peak: the profiled activations plus the graphs' estimate
    worker = Path(importlib.util.find_spec("vllm.v1.worker.gpu_worker").origin).read_text()  # type: ignore[arg-type]
    document["peak_includes_graph_estimate"] = bool(re.search(
        r"peak_activation_memory = \(\s*profile_result\.transient_peak_headroom \+ cudagraph_memory_estimate\s*\)",
        worker))
    try:  # 0.34.0's extensible KV cache: its sizing function, on figures the test gives, and its margins
        from vllm.v1.worker import extensible_kv_cache as extensible

        document["extensible"] = {
            "margin_floor_bytes": extensible.KV_CACHE_MARGIN_FLOOR_BYTES,
            "margin_fraction": extensible.KV_CACHE_MARGIN_FRACTION,
            "sample": extensible.measure_kv_cache_bytes(
                init_free_memory=139 * GIB, free_memory=120 * GIB, committed_bytes=0, requested_memory=140 * GIB,
                transient_peak_bytes=3 * GIB),
        }
    except ImportError:
        document["extensible"] = None
    print(json.dumps(document, default=str))


if __name__ == "__main__":
    main()
