"""sim/settings.py and SimConfig's composition of it: each concern checks its own settings and names the one that
is wrong; SimConfig fills what is left None with the engine's release's defaults."""

from __future__ import annotations

import pytest

from minipaged_cli.errors import InputError
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.settings import CacheSettings, EngineSettings, OutputSettings, TierSettings
from minipaged_cli.workloads.presets import GpuSpec, ModelSpec, load_gpu, load_model

QWEN3_8B, H200 = load_model("qwen3-8b"), load_gpu("h200")


@pytest.mark.parametrize(("build", "line"), [
    (lambda: EngineSettings(max_num_seqs=0), "max_num_seqs: 0: must be >= 1"),
    (lambda: EngineSettings(scheduler="v2"), "scheduler: 'v2': expected one of v1, v0"),
    (lambda: EngineSettings(watermark=1.0), "watermark: 1.0: must be in [0, 1)"),
    (lambda: EngineSettings(preemption="swap"), "preemption: 'swap': vLLM v1 preempts by recompute only; swap is "
                                                "the v0 engine's (scheduler=v0)"),
    (lambda: EngineSettings(vllm_version="0.33", cache_aware_admission_window=4),
     "cache_aware_admission_window: 4: cache-aware admission is vLLM 0.34.0's; vLLM 0.33.0 admits in arrival order "
     "(vllm_version=0.34)"),
    (lambda: CacheSettings(0), "num_blocks: 0: must be >= 1"),
    (lambda: CacheSettings(8, cpu_blocks=-1), "cpu_blocks: -1: must be >= 0"),
    (lambda: TierSettings(offload_policy="write-thru"),
     "offload_policy: 'write-thru': expected one of write-through, on-eviction (did you mean 'write-through'?)"),
    (lambda: TierSettings(cpu_kv_blocks=4, tier_inclusion="exclusive"),
     "tier_inclusion: 'exclusive': an exclusive tier gets its blocks back only when the GPU evicts them: it needs "
     "offload_policy=on-eviction, not write-through"),
])
def test_each_concern_names_the_setting_that_is_wrong(build, line: str) -> None:
    with pytest.raises(InputError) as caught:
        build()
    assert str(caught.value) == line


def test_the_short_form_is_the_composition() -> None:
    short = SimConfig.of(QWEN3_8B, H200, 64, scheduler="v0", preemption="swap", cpu_kv_blocks=8,
                         check_invariants=True, max_model_len=4096)
    long = SimConfig(QWEN3_8B, H200, CacheSettings(64), EngineSettings(scheduler="v0", preemption="swap"),
                     TierSettings(cpu_kv_blocks=8), OutputSettings(check_invariants=True), max_model_len=4096)
    assert short == long
    with pytest.raises(TypeError):
        SimConfig.of(QWEN3_8B, H200, 64, max_num_seq=8)  # (a misspelt setting is no setting)


def test_what_is_left_none_takes_the_engines_defaults_and_what_is_given_stays() -> None:
    # vLLM v0's engine (the paper's): 16-token blocks, 256 sequences, whole prompts, a 1 % watermark, no prefix
    # cache, no hybrid manager; 0.33.0 has no cache-aware admission (window 0, threshold 0)
    v0 = SimConfig.of(QWEN3_8B, H200, 100, scheduler="v0", vllm_version="0.33.0")
    assert (v0.cache.block_size, v0.cache.prefix_caching, v0.cache.hybrid_kv) == (16, False, False)
    assert (v0.engine.max_num_seqs, v0.engine.max_batched_tokens, v0.engine.watermark) == (256, None, 0.01)
    assert (v0.engine.vllm_version, v0.engine.cache_aware_admission_window,
            v0.engine.cache_aware_admission_threshold) == ("0.33", 0, 0.0)
    assert v0.watermark_blocks == 1 and v0.kv_capacity_tokens == 1600
    given = SimConfig.of(QWEN3_8B, H200, 100, block_size=32, max_num_seqs=7, watermark=0.25, prefix_caching=False)
    assert (given.block_size, given.engine.max_num_seqs, given.engine.watermark) == (32, 7, 0.25)
    assert not given.cache.prefix_caching and given.watermark_blocks == 25


def test_the_rules_across_concerns_name_a_setting(tiny_model: ModelSpec, clock_gpu: GpuSpec) -> None:
    with pytest.raises(InputError, match=r"^cpu_blocks: 0: swap needs a CPU pool; set cpu_blocks or cpu_kv_memory$"):
        SimConfig.of(tiny_model, clock_gpu, 8, scheduler="v0", preemption="swap")
    with pytest.raises(InputError, match=r"^disk_kv_blocks: 4: a disk tier under scheduler=v0 is not modelled"):
        SimConfig.of(tiny_model, clock_gpu, 8, scheduler="v0", preemption="swap", cpu_kv_blocks=4, disk_kv_blocks=4)
    with pytest.raises(InputError, match=r"^cpu_kv_memory: the host tier holds prefix-cache blocks: it needs "
                                         r"prefix_caching=True$"):
        SimConfig.of(tiny_model, clock_gpu, 8, prefix_caching=False, cpu_kv_blocks=4)


def test_a_change_goes_to_its_concern_and_leaves_the_others() -> None:
    config = SimConfig.of(QWEN3_8B, H200, 100, cpu_kv_blocks=8)
    changed = config.with_settings(num_blocks=50, tier_eviction="arc", max_model_len=2048)
    assert (changed.cache.num_blocks, changed.tiers.tier_eviction, changed.max_model_len) == (50, "arc", 2048)
    assert changed.engine == config.engine and changed.outputs == config.outputs
    assert changed.tiers.cpu_kv_blocks == 8 and changed.cache.block_size == config.cache.block_size
