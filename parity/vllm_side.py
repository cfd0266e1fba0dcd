"""vLLM's own v1 scheduler (``Scheduler``, ``KVCacheManager``, ``BlockPool``), unmodified, replaying a trace.

No model and no GPU: the scheduler is built the way vLLM's ``tests/v1/core/utils.py::create_scheduler`` does, on a
``ModelConfig`` of a tiny local Qwen3 ``config.json`` with ``skip_tokenizer_init`` (nothing is downloaded), and a
``KVCacheConfig`` of one full-attention group of N + 1 blocks (block 0 is vLLM's null block, so N hold KV).
Each step: ``schedule()``, then a ``ModelRunnerOutput`` that samples one token for every scheduled request whose
prompt is now fully computed (a partial prefill samples nothing, as the model runner discards it), then
``update_from_output()``; requests stop at ``max_tokens`` (``ignore_eos``). The clock is minipaged's step-time
model on the same batch shape, so arrivals land in the same steps as in minipaged's replay.

Token ids stand for the trace's content: each shared segment's tokens are one id of its own, each request's own
prompt another, each sample's output another, so vLLM's block hashes match exactly where minipaged's content keys
do. A request with ``n`` > 1 enters as n requests with the same prompt (v1's parallel sampling: the children share
the prompt through prefix caching).

Import this module only in the reference venv (``parity/setup_env.sh``), with ``VLLM_TARGET_DEVICE`` unset on a
machine without an accelerator: vLLM then selects no platform (its ``UnspecifiedPlatform``, which leaves every config
as given), and the ``DeviceConfig`` below names the device. vLLM 0.34.0's CPU platform refuses to build a
``VllmConfig`` on x86 without triton-cpu, which the scheduler never uses (parity/README.md).
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque
from pathlib import Path

import torch
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from minipaged_cli.sim.config import SimConfig
from minipaged_cli.workloads.trace import Trace
from parity.steps import ReplayRecord, StepClock, StepRecord, request_key

TINY_MODEL = Path(__file__).parent / "tiny-qwen3"

# Token-id ranges that keep the three kinds of content apart (the scheduler never looks a token id up), all within
# int32: 0.34.0 keeps a request's token ids in an int32 array.
_SEGMENT_BASE = 1
_PROMPT_BASE = 1 << 24
_OUTPUT_BASE = 1 << 30


class VllmError(RuntimeError):
    """vLLM's scheduler stopped making progress (it would wait forever)."""


def build_scheduler(config: SimConfig) -> Scheduler:
    """vLLM's v1 scheduler on minipaged's settings: the same pool, block size, budget, batch limit, watermark,
    max model length and prefix caching."""
    max_model_len = config.model_len
    cache_aware = {}
    if config.engine.cache_aware_admission_window:  # (0.34.0's options; 0.33.0 has none and refuses them)
        cache_aware = {"cache_aware_admission_window": config.engine.cache_aware_admission_window,
                       "cache_aware_admission_threshold": config.engine.cache_aware_admission_threshold}
    scheduler_config = SchedulerConfig(
        max_num_seqs=config.engine.max_num_seqs, max_num_batched_tokens=config.prefill_token_limit,
        max_model_len=max_model_len, enable_chunked_prefill=config.engine.max_batched_tokens is not None,
        watermark=config.engine.watermark, is_encoder_decoder=False,
        # What the CPU platform set, written out (no platform sets it here): synchronous scheduling, one
        # schedule() and then its output, as this replay drives it.
        async_scheduling=False, **cache_aware)
    model_config = ModelConfig(model=str(TINY_MODEL), skip_tokenizer_init=True, dtype="float16", seed=0,
                               max_model_len=max_model_len)
    cache_config = CacheConfig(block_size=config.block_size, enable_prefix_caching=config.cache.prefix_caching)
    # DeviceConfig's device is deprecated in 0.34.0, and still the documented way to name one no platform infers.
    vllm_config = VllmConfig(scheduler_config=scheduler_config, model_config=model_config, cache_config=cache_config,
                             device_config=DeviceConfig(device="cpu"))
    num_blocks = config.cache.num_blocks + 1  # block 0 is the null block
    # One layer of one head of size 1: the scheduler counts blocks, never bytes.
    spec = FullAttentionSpec(block_size=config.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv_cache_config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                                    kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    cache_config.num_gpu_blocks = num_blocks
    return Scheduler(vllm_config=vllm_config, kv_cache_config=kv_cache_config,
                     structured_output_manager=StructuredOutputManager(vllm_config), block_size=config.block_size,
                     log_stats=True)


def _runner_output(ids: list[str], sampled: list[list[int]]) -> ModelRunnerOutput:
    """The model runner's output: one list of sampled token ids a request, in ``ids``' order (0.33.0 also took the
    index of each id; 0.34.0 derives it)."""
    if "req_id_to_index" in {field.name for field in dataclasses.fields(ModelRunnerOutput)}:
        return ModelRunnerOutput(req_ids=ids, req_id_to_index={key: i for i, key in enumerate(ids)},
                                 sampled_token_ids=sampled)
    return ModelRunnerOutput(req_ids=ids, sampled_token_ids=sampled)


def vllm_steps(trace: Trace, config: SimConfig) -> ReplayRecord:
    """Replay ``trace`` through vLLM's scheduler on ``config``'s settings, one record per step."""
    logging.getLogger("vllm").setLevel(logging.ERROR)  # its config warnings are about a real model and device
    scheduler = build_scheduler(config)
    block_hasher = None
    if config.cache.prefix_caching:
        hash_fn = get_hash_fn_by_name(scheduler.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        block_hasher = get_request_block_hasher(config.block_size, hash_fn)
    manager = scheduler.kv_cache_manager
    pool = manager.block_pool
    clock = StepClock(trace, config)
    segment_ids = {name: _SEGMENT_BASE + i for i, name in enumerate(trace.segments)}
    output_ids: dict[str, int] = {}
    arrivals = deque(enumerate(trace.requests))
    prefill_end: dict[str, int] = {}  # tokens to compute before a request decodes, set at each (re)admission
    steps: list[StepRecord] = []
    now = 0.0
    while arrivals or scheduler.get_num_unfinished_requests():
        while arrivals and arrivals[0][1].arrival_s <= now:
            index, request = arrivals.popleft()
            if request.prompt_tokens > config.model_len:
                continue  # vLLM's input processor rejects it; a longer output is cut at max_model_len instead
            prompt = [token for name in request.prefix for token in [segment_ids[name]] * trace.segments[name]]
            prompt += [_PROMPT_BASE + index] * (request.prompt_tokens - len(prompt))
            for sample in range(request.n):
                key = request_key(index, sample)
                output_ids[key] = _OUTPUT_BASE + len(output_ids)
                scheduler.add_request(Request(key, prompt, SamplingParams(max_tokens=request.output_tokens,
                                                                          ignore_eos=True),
                                              None, arrival_time=request.arrival_s, block_hasher=block_hasher))
        if not scheduler.get_num_unfinished_requests():
            now = max(now, arrivals[0][1].arrival_s)  # idle until the next arrival
            continue
        stats = manager.prefix_cache_stats
        queries, hits = stats.queries, stats.hits
        output = scheduler.schedule()
        stats = manager.prefix_cache_stats  # the same object: make_stats() replaces it only in update_from_output
        scheduled = dict(output.num_scheduled_tokens)
        preempted = sorted(output.preempted_req_ids or ())
        if not scheduled and not preempted:
            if arrivals:
                scheduler.update_from_output(output, _runner_output([], []))
                now = max(now, arrivals[0][1].arrival_s)
                continue
            raise VllmError(f"vLLM scheduled nothing at t = {now:.3f} s with "
                            f"{scheduler.get_num_unfinished_requests()} requests left (none can ever fit)")
        # 0.34.0 re-sends a resumed request among the new ones; 0.33.0 listed it apart
        resumed = getattr(output.scheduled_cached_reqs, "resumed_req_ids", ())
        admitted = {data.req_id for data in output.scheduled_new_reqs} | set(resumed)
        decodes, chunks, sampled = [], [], []
        for key, tokens in scheduled.items():
            request = scheduler.requests[key]
            before = request.num_computed_tokens - tokens  # schedule() has counted this step's tokens
            if key in admitted:
                prefill_end[key] = request.num_tokens
            if before >= prefill_end[key]:
                decodes.append(before)
            else:
                chunks.append((before, tokens))
            # the model runner discards what a partial prefill samples
            sampled.append([output_ids[key]] if request.num_computed_tokens >= request.num_tokens else [])
        record = StepRecord(now, scheduled, preempted, [], stats.queries - queries, stats.hits - hits,
                            pool.num_gpu_blocks - 1 - pool.get_num_free_blocks())
        steps.append(record)
        ids = list(scheduled)
        scheduler.update_from_output(output, _runner_output(ids, sampled))
        record.finished = [key for key in ids if key not in scheduler.requests]
        if scheduled:
            record.duration_s = clock.seconds(decodes, chunks)
            now += record.duration_s
    return ReplayRecord(steps, config.cache.num_blocks)
