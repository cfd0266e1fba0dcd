"""The one map from the library's setting names to the command line's flags: an error the library raises names a
setting (``max_num_seqs``, ``{scheduler=v0}`` in its message), and the command line shows the flag that sets it
(``--max-num-seqs``, ``--scheduler v0``)."""

from __future__ import annotations

from minipaged_cli.errors import InputError, name_settings, setting_name

FLAGS = {
    # the engine (sim/settings.py: EngineSettings)
    "scheduler": "--scheduler",
    "vllm_version": "--vllm-version",
    "max_num_seqs": "--max-num-seqs",
    "max_batched_tokens": "--max-batched-tokens",
    "watermark": "--watermark",
    "preemption": "--preemption",
    "long_prefill_token_threshold": "--long-prefill-threshold",
    # the KV cache (CacheSettings) and how it is sized (sim/kv_sizing.py)
    "num_blocks": "--num-blocks",
    "block_size": "--block-size",
    "prefix_caching": "--prefix-caching",
    "hybrid_kv": "--hybrid-kv",
    "cpu_blocks": "--cpu-blocks",
    "kv_memory": "--kv-memory",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "kv_cache_dtype": "--kv-cache-dtype",
    "kv_scales": "--kv-scales",
    # the tiers (TierSettings): the command line gives them in bytes, the library counts blocks
    "cpu_kv_memory": "--cpu-kv-memory",
    "disk_kv_memory": "--disk-kv-memory",
    "cpu_kv_blocks": "--cpu-kv-memory (blocks)",
    "disk_kv_blocks": "--disk-kv-memory (blocks)",
    "offload_policy": "--offload-policy",
    "tier_eviction": "--tier-eviction",
    "tier_inclusion": "--tier-inclusion",
    "layerwise_loads": "--layerwise-loads",
    # the model and the GPU
    "model": "--model",
    "gpu": "--gpu",
    "max_model_len": "--max-model-len",
    "calibration": "--calibration",
    "model_config": "--model-config",
    "model_path": "--model-path",
    "from_vidur": "--from-vidur",
    # the workload (workloads/readers.py, sim/clients.py)
    "trace_format": "--trace-format",
    "limit": "--limit",
    "rate": "--rate",
    "seed": "--seed",
    "time_scale": "--time-scale",
    "tokenizer": "--tokenizer",
    "concurrency": "--concurrency",
    "max_concurrency": "--max-concurrency",
    # what runs where, and the sweep
    "strategies": "--strategies",
    "device": "--device",
    "layer": "--layer",
    "seq_lens": "--seq-lens",
    "ray": "--ray",
    "seeds": "--seeds",
    "rates": "--rates",
    "slo": "--slo",
    # the fleet (fleet/config.py)
    "replicas": "--replicas",
    "router_weights": "--router-weights",
    "kv_link_bandwidth": "--kv-link-bandwidth",
    "kv_link_latency": "--kv-link-latency",
}


def flag_for(setting: str, value: str | None = None) -> str:
    """A setting as the command line gives it: ``--max-num-seqs``, ``--scheduler v0``, ``--no-hybrid-kv``; a name
    that no flag sets stays the library's."""
    flag = FLAGS.get(setting)
    if flag is None:
        return setting_name(setting, value)
    if value is None or value == "True":
        return flag
    if value == "False":
        return flag.replace("--", "--no-", 1)
    return f"{flag} {value}"


def error_line(error: InputError) -> str:
    """``error`` as the command line's one line: its settings named by their flags."""
    return error.line(flag_for)


def note_line(text: str) -> str:
    """A note of the library (a ``FallbackWarning``) with its settings named by their flags."""
    return name_settings(text, flag_for)
