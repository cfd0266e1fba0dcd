"""The KV cache's memory as vLLM sizes it at startup, under each release's rule (``sim/vllm_releases.py``).

Both rules start from the device's memory as CUDA reports it (``GpuSpec.reported_memory_bytes``, T) and take away
what is not KV cache: the weights (W, every tensor: ``ModelSpec.weight_bytes``), the CUDA graphs' pool (G), what
the engine allocates outside torch (R), and the activation peak of a profiling step (A, ``activation_peak_bytes``).

- **Profiling estimate** (vLLM 0.33.0, ``Worker.determine_available_memory``): KV = ceil(u * T) - W - R - A - G,
  with u = gpu_memory_utilization, 0.92 by default. The CUDA context (C) predates vLLM's first snapshot: it
  comes out of the (1 - u) left over.
- **Extensible KV cache** (vLLM 0.34.0, ``measure_kv_cache_bytes``): the cache is sized from the memory measured
  free after warmup and graph capture, everything but the cache (U = W + G + R) being resident then, and the
  transient peak kept free: the profiled activations plus the graphs' estimate (``Worker.peak_activation_memory``,
  P = A + G): KV = min(ceil(u * T) - U, T - C - U - margin) - P, margin = max(1 GiB, 0.75 P); u is 1.0 by
  default, so the device bound (the second term) decides.

G, R and C are constants of the GPU preset (``configs/gpus/*.yaml``, with their sources; a GPU file may set its
own), A an estimate from the model's shapes: what vLLM measures at startup is what a user's log shows.
``resolve_num_blocks`` turns the options of a command (``--num-blocks``, ``--kv-memory``, else this sizing) into
the pool's blocks, ``tier_blocks`` a tier's size into blocks of the pool's size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from minipaged_cli.errors import InputError
from minipaged_cli.memory.kv_groups import block_bytes, kv_cache_groups
from minipaged_cli.sim.config import num_blocks_for_memory
from minipaged_cli.sim.vllm_releases import GIB, LATEST_VLLM, VllmRelease, vllm_release
from minipaged_cli.units import format_bytes, parse_bytes
from minipaged_cli.workloads.presets import GpuSpec, ModelSpec

# 0.34.0's vllm/v1/worker/extensible_kv_cache.py: the margin kept below the device's headroom on CUDA.
KV_CACHE_MARGIN_FLOOR_BYTES = 1 * GIB
KV_CACHE_MARGIN_FRACTION = 0.75
# The sampler's dummy run at max_num_seqs rows: the float32 logits and three working copies of them (the
# temperature-scaled logits, the probabilities, the sorted values of top-k/top-p), vocab_size wide.
SAMPLER_LOGITS_COPIES = 4
FLOAT32_BYTES = 4


def activation_peak_bytes(model: ModelSpec, max_num_batched_tokens: int, max_num_seqs: int) -> int:
    """The activation peak of vLLM's profiling step (``profile_run``): a forward of ``max_num_batched_tokens``
    tokens, then the sampler on ``max_num_seqs`` rows. An estimate from the shapes, not a measurement:

    - the forward's peak is a layer's MLP: its gate/up output (2 x the MLP width) and the activation's (1 x),
      beside the hidden states and the residual (2 x hidden), one element each per token in the model's dtype;
      the MLP width is intermediate_size in a dense layer, (num_experts_per_tok + shared experts) x
      moe_intermediate_size in a MoE one (the fused MoE kernel's intermediate cache), the larger where both are;
    - the sampler's: ``SAMPLER_LOGITS_COPIES`` float32 copies of the logits.

    Checked against vLLM's own profiles (``tests/sim/test_kv_sizing.py``: Llama-3-8B at 8,192 tokens and 256
    sequences, 1.19-1.26 GiB published, 1.27 GiB here)."""
    widths = [model.intermediate_size] if model.num_layers > model.num_moe_layers else []
    if model.is_moe:
        routed = (model.num_experts_per_tok or 0) + model.num_shared_experts
        widths.append(routed * (model.moe_intermediate_size or model.intermediate_size))
    per_token = (3 * max(widths) + 2 * model.hidden_size) * model.dtype_bytes
    sampler = max_num_seqs * model.vocab_size * FLOAT32_BYTES * SAMPLER_LOGITS_COPIES
    return max_num_batched_tokens * per_token + sampler


@dataclass(frozen=True)
class KvSizing:
    """What vLLM's startup sizing takes from the device and leaves to the KV cache, in bytes."""

    release: str
    extensible: bool  # the rule: measured after warmup (0.34.0), else the profiling estimate (0.33.0)
    total_memory_bytes: int
    gpu_memory_utilization: float
    weight_bytes: int
    activation_bytes: int
    cuda_graph_bytes: int
    non_torch_bytes: int
    cuda_context_bytes: int  # only the extensible rule counts it
    margin_bytes: int  # the extensible rule's
    kv_memory_bytes: int

    @property
    def phrase(self) -> str:
        """Where the KV memory came from, as the header of ``simulate`` shows it."""
        gib = format_bytes
        terms = [f"weights {gib(self.weight_bytes)}", f"activations {gib(self.activation_bytes)}",
                 f"CUDA graphs {gib(self.cuda_graph_bytes)}", f"non-torch {gib(self.non_torch_bytes)}"]
        if self.extensible:
            terms += [f"CUDA context {gib(self.cuda_context_bytes)}", f"graphs' estimate kept free "
                      f"{gib(self.cuda_graph_bytes)}", f"margin {gib(self.margin_bytes)}"]
        rule = "extensible KV cache" if self.extensible else "profiling estimate"
        return (f"vLLM {self.release} sizing ({rule}): {self.gpu_memory_utilization:g} of "
                f"{gib(self.total_memory_bytes)} minus {', '.join(terms)}")

    def to_dict(self) -> dict[str, Any]:
        return {"vllm_version": self.release, "rule": "extensible" if self.extensible else "profiling-estimate",
                "total_memory_bytes": self.total_memory_bytes,
                "gpu_memory_utilization": self.gpu_memory_utilization, "weight_bytes": self.weight_bytes,
                "activation_bytes": self.activation_bytes, "cuda_graph_bytes": self.cuda_graph_bytes,
                "non_torch_bytes": self.non_torch_bytes, "cuda_context_bytes": self.cuda_context_bytes,
                "margin_bytes": self.margin_bytes, "kv_memory_bytes": self.kv_memory_bytes}


def extensible_margin_bytes(transient_bytes: int) -> int:
    """0.34.0's margin below the device's headroom: max(1 GiB, 0.75 x the transient peak)."""
    return max(KV_CACHE_MARGIN_FLOOR_BYTES, int(transient_bytes * KV_CACHE_MARGIN_FRACTION))


def extensible_kv_bytes(requested: int, free_at_start: int, resident: int, transient_bytes: int) -> int:
    """0.34.0's extensible KV cache (``measure_kv_cache_bytes``): the budget ``requested`` less what is resident
    besides the cache, capped by the device's headroom (what was free when vLLM started, less the same) less the
    margin, then the transient peak kept free."""
    headroom = free_at_start - resident
    return min(requested - resident, headroom - extensible_margin_bytes(transient_bytes)) - transient_bytes


def size_kv_cache(model: ModelSpec, gpu: GpuSpec, release: VllmRelease, *, gpu_memory_utilization: float | None,
                  max_num_batched_tokens: int, max_num_seqs: int) -> KvSizing:
    """The KV cache's bytes under ``release``'s rule (the module's docstring); ``gpu_memory_utilization`` None
    takes the release's default."""
    utilization = release.gpu_memory_utilization if gpu_memory_utilization is None else gpu_memory_utilization
    total = int(gpu.reported_memory_bytes)
    requested = math.ceil(total * utilization)
    weights, graphs = math.ceil(model.weight_bytes), int(gpu.cuda_graph_bytes)
    non_torch, context = int(gpu.non_torch_bytes), int(gpu.cuda_context_bytes)
    activations = activation_peak_bytes(model, max_num_batched_tokens, max_num_seqs)
    resident = weights + graphs + non_torch
    if release.extensible_kv_cache:  # (the graphs' estimate is kept free beside the activations, as 0.34.0 does)
        margin = extensible_margin_bytes(activations + graphs)
        available = extensible_kv_bytes(requested, total - context, resident, activations + graphs)
    else:
        margin = 0
        available = requested - resident - activations
    return KvSizing(release=release.version, extensible=release.extensible_kv_cache, total_memory_bytes=total,
                    gpu_memory_utilization=utilization, weight_bytes=weights, activation_bytes=activations,
                    cuda_graph_bytes=graphs, non_torch_bytes=non_torch,
                    cuda_context_bytes=context if release.extensible_kv_cache else 0, margin_bytes=margin,
                    kv_memory_bytes=max(available, 0))


def resolve_num_blocks(model: ModelSpec, gpu: GpuSpec, block_size: int, num_blocks: int | None,
                       kv_memory: str | None, gpu_memory_utilization: float | None, *, hybrid: bool = True,
                       vllm_version: str = LATEST_VLLM, max_num_batched_tokens: int | None = None,
                       max_num_seqs: int | None = None) -> tuple[int, str, KvSizing | None]:
    """The KV capacity in blocks, a phrase saying where it came from, and vLLM's sizing when it came from there
    (``sim/kv_sizing.py``, under ``vllm_version``'s rule; the batch limits its profiling step runs at default to
    the release's for the GPU), the phrase naming its settings as ``{setting}`` (``cli/flags.py`` shows flags).
    ``num_blocks`` and ``kv_memory`` are exact: no sizing."""
    if block_size < 1:
        raise InputError("must be >= 1", field="{block_size}", value=block_size, has_value=True)
    if num_blocks is not None and kv_memory is not None:
        raise InputError("give either {num_blocks} or {kv_memory}, not both", field="{num_blocks}")
    if num_blocks is not None:
        if num_blocks < 1:
            raise InputError("must be >= 1", field="{num_blocks}", value=num_blocks, has_value=True)
        return num_blocks, "{num_blocks}", None
    sizing = None
    if kv_memory is not None:
        memory = parse_bytes(kv_memory)
        origin = f"{{kv_memory={kv_memory}}}"
    else:
        if gpu_memory_utilization is not None and not 0 < gpu_memory_utilization <= 1:
            raise InputError("must be in (0, 1]", field="{gpu_memory_utilization}", value=gpu_memory_utilization,
                             has_value=True)
        release = vllm_release(vllm_version)
        batched_tokens, num_seqs = release.batch_defaults(gpu)
        sizing = size_kv_cache(model, gpu, release, gpu_memory_utilization=gpu_memory_utilization,
                               max_num_batched_tokens=max_num_batched_tokens or batched_tokens,
                               max_num_seqs=max_num_seqs or num_seqs)
        memory, origin = sizing.kv_memory_bytes, sizing.phrase
        if memory <= 0:
            raise InputError(f"leaves no KV memory on this GPU ({origin}); pass {{kv_memory}}", field="{gpu}",
                             value=gpu.name, has_value=True)
    blocks = num_blocks_for_memory(memory, model, block_size, hybrid=hybrid)
    if blocks < 1:
        one_block = format_bytes(block_bytes(model, kv_cache_groups(model, hybrid=hybrid), block_size))
        raise InputError(f"holds no block of {block_size} tokens ({one_block})", field="{kv_memory}",
                         value=kv_memory if kv_memory is not None else format_bytes(memory), has_value=True)
    return blocks, origin, sizing


def tier_blocks(size: str | None, model: ModelSpec, block_size: int, setting: str, *, hybrid: bool) -> int:
    """A tier's capacity written as a size (``64GiB``; ``0`` or None: no tier) in blocks of the GPU pool's size:
    ``block_size`` tokens of ``model``'s KV in one KV cache group's layers under the hybrid manager (``hybrid``),
    in every layer without it."""
    if size is None:
        return 0
    memory = parse_bytes(size, field=setting, allow_zero=True)
    blocks = num_blocks_for_memory(memory, model, block_size, hybrid=hybrid)
    if memory and not blocks:
        one_block = format_bytes(block_bytes(model, kv_cache_groups(model, hybrid=hybrid), block_size))
        raise InputError(f"holds no block of {block_size} tokens ({one_block})", field=setting, value=size,
                         has_value=True)
    return blocks
