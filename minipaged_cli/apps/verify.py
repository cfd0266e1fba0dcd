"""``minipaged verify``: Qwen3 attention through the paged cache against Hugging Face's own Qwen3 code.

Layer checks: the hidden states entering layer N's attention (after its input norm) and the attention's output
(after o_proj) are captured from Hugging Face's eager forward pass; the paged path recomputes q/k/v, QK-norm and
RoPE with that layer's weights, writes every token's K/V through the ``KVBlockManager``'s slots into a
``PagedKVCache`` whose blocks are scrambled, runs decode paged attention for every position and o_proj, and is
compared with what Hugging Face computed. Then ``decode_steps`` more tokens go through one at a time, appended to
the cache. The generation check runs the whole model with every layer's attention paged and compares greedy
tokens and logits with Hugging Face ``generate``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from minipaged_cli.apps.qwen3 import LayerAttention, PagedAttentionState, PagedQwen3, rope_theta
from minipaged_cli.apps.verify_fp8 import FP8_SIGMAS, fp8_logit_sigma, fp8_sigma
from minipaged_cli.dataplane.backends import Backend
from minipaged_cli.dataplane.block_tables import append_slots
from minipaged_cli.dataplane.fp8 import cache_dtype
from minipaged_cli.dataplane.kv_scales import DEFAULT_SCALE_MODE
from minipaged_cli.errors import InputError

FP32_TOLERANCE = 1e-4
# In bf16/fp16 both sides round to the dtype at different points: Hugging Face applies RoPE in the dtype (three
# roundings to our one), rounds the softmax probabilities before the PV product (we keep them in fp32), then both
# round the PV product and o_proj's output. Each rounding is a relative error of at most eps / 2 of a value of
# the output's order (q and k are RMS-normalised, so logits are O(1)); the errors are independent and add like a
# random walk through o_proj's sums, so the outputs differ by about one ulp of their own magnitude (measured: 1).
# Bound: 4 ulps (4 eps) of the largest |output| - well below what one misplaced token does (O(1) errors).
LOW_PRECISION_ULPS = 4


@dataclass
class Check:
    name: str
    max_abs_err: float
    mean_abs_err: float
    tolerance: float
    why: str

    @property
    def passed(self) -> bool:
        return self.max_abs_err <= self.tolerance

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "max_abs_err": self.max_abs_err, "mean_abs_err": self.mean_abs_err,
                "tolerance": self.tolerance, "passed": self.passed}


@dataclass
class VerifyReport:
    layer: int
    dtype: str
    device: str
    backend: str
    kv_cache_dtype: str = "auto"
    checks: list[Check] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    def to_dict(self) -> dict[str, Any]:
        return {"layer": self.layer, "dtype": self.dtype, "device": self.device, "backend": self.backend,
                "kv_cache_dtype": self.kv_cache_dtype, "checks": [c.to_dict() for c in self.checks],
                "passed": self.passed}


def make_prompts(seq_lens: list[int], vocab_size: int, seed: int) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab_size, (n,), generator=generator).tolist() for n in seq_lens]


@torch.no_grad()
def capture_attention(model: Any, layer: int, token_ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Hugging Face's eager forward over one sequence: layer ``layer``'s attention input (after its input norm)
    and output (after o_proj), each [tokens, hidden_size]."""
    captured: dict[str, torch.Tensor] = {}
    attention = model.model.layers[layer].self_attn

    def before(module: Any, args: tuple, kwargs: dict) -> None:
        captured["input"] = kwargs["hidden_states"][0].detach().clone()

    def after(module: Any, args: tuple, kwargs: dict, output: Any) -> None:
        captured["output"] = output[0][0].detach().clone()

    hooks = [attention.register_forward_pre_hook(before, with_kwargs=True),
             attention.register_forward_hook(after, with_kwargs=True)]
    try:
        device = next(model.parameters()).device
        model(torch.tensor([token_ids], device=device), use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    return captured["input"], captured["output"]


def tolerance_for(dtype: torch.dtype, reference: torch.Tensor) -> tuple[float, str]:
    """The check's bound and why (see LOW_PRECISION_ULPS)."""
    if dtype == torch.float32:
        return FP32_TOLERANCE, "fp32: both sides compute in fp32; only summation order differs"
    magnitude = float(reference.abs().max())
    return (LOW_PRECISION_ULPS * torch.finfo(dtype).eps * magnitude,
            f"{str(dtype).split('.')[-1]}: {LOW_PRECISION_ULPS} eps x the largest |output| ({magnitude:.3g})")


def errors(ours: torch.Tensor, reference: torch.Tensor) -> tuple[float, float]:
    difference = (ours.float() - reference.float()).abs()
    return float(difference.max()), float(difference.mean())


@torch.no_grad()
def verify_layer(model: Any, layer: int, prompts: list[list[int]], decode_steps: int, backend: Backend,
                 block_size: int, seed: int, corrupt: str | None = None, kv_cache_dtype: str = "auto",
                 scale_mode: str = DEFAULT_SCALE_MODE) -> list[Check]:
    """Prefill and decode checks of one layer. ``corrupt`` ('swap-blocks' or 'offset-slot') breaks the paged
    path on purpose, to show the checks can fail. With an fp8 ``kv_cache_dtype`` the layer's scales are
    calibrated on every K and V it will store (no value saturates), and each check's tolerance grows by
    FP8_SIGMAS x fp8_sigma."""
    num_layers = len(model.model.layers)
    if not 0 <= layer < num_layers:
        raise InputError(f"the model has layers 0..{num_layers - 1}", field="{layer}", value=layer, has_value=True)
    dtype = next(model.parameters()).dtype
    generator = torch.Generator().manual_seed(seed + 1)
    vocab = model.config.vocab_size
    sequences = [p + torch.randint(0, vocab, (decode_steps,), generator=generator).tolist() for p in prompts]
    captured = [capture_attention(model, layer, ids) for ids in sequences]
    attention = LayerAttention(model.model.layers[layer].self_attn, rope_theta(model.config))
    head_dim = attention.module.head_dim
    total_tokens = sum(len(s) for s in sequences)
    num_blocks = 2 * (total_tokens // block_size + len(sequences)) + 8
    stored = cache_dtype(kv_cache_dtype, dtype)
    state = PagedAttentionState(1, num_blocks, attention.num_kv_heads, block_size, head_dim, dtype, backend, seed,
                                stored, scale_mode)
    device = backend.device
    sigmas = None  # per sequence: [tokens, hidden], the fp8 rounding's standard deviation of each output
    if state.cache.quantized:
        whole = [attention.qkv(hidden, torch.arange(len(hidden), device=device)) for hidden, _ in captured]
        state.cache.calibrate(0, torch.cat([k for _, k, _ in whole]), torch.cat([v for _, _, v in whole]))
        k_scale, v_scale = state.cache.scales(0)
        sigmas = [fp8_sigma(q, k, v, attention.module.scaling, attention.module.o_proj.weight, stored, k_scale,
                            v_scale) for q, k, v in whole]

    def project(index: int, positions: range) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        hidden = captured[index][0][positions.start:positions.stop]
        return attention.qkv(hidden, torch.arange(positions.start, positions.stop, device=device))

    # Prefill: every prompt token's K/V through its slot; every position as a decode query over its prefix.
    queries, rows = [], []
    for index, prompt in enumerate(prompts):
        state.manager.create_sequence(index)
        slots = append_slots(state.manager, index, len(prompt))
        if corrupt == "offset-slot" and index == 0 and len(slots) > 1:
            slots[0], slots[1] = slots[1], slots[0]
        q, k, v = project(index, range(len(prompt)))
        state.write(0, k, v, slots)
        queries.append(q)
        rows.extend((index, position) for position in range(len(prompt)))
    if corrupt == "swap-blocks":
        table = max(state.manager.sequences.values(), key=lambda s: len(s.block_table)).block_table
        if len(table) < 2:
            raise InputError("swap-blocks needs a prompt longer than one block", field="{seq_lens}")
        table[0], table[1] = table[1], table[0]
    out = state.attend(0, torch.cat(queries), [s for s, _ in rows], [p + 1 for _, p in rows],
                       attention.module.scaling)
    ours = attention.output(out)
    reference = torch.cat([captured[s][1][: len(prompts[s])] for s in range(len(prompts))])
    sigma = None if sigmas is None else max(float(sigmas[s][: len(prompts[s])].max()) for s in range(len(prompts)))
    checks = [_check("prefill: every prompt position", ours, reference, dtype, sigma)]

    # Decode: one new token per sequence per step, appended to the paged cache.
    if decode_steps:
        ours_steps, reference_steps = [], []
        for step in range(decode_steps):
            slots = [slot for s in range(len(prompts)) for slot in append_slots(state.manager, s, 1)]
            parts = [project(s, range(len(prompts[s]) + step, len(prompts[s]) + step + 1))
                     for s in range(len(prompts))]
            state.write(0, torch.cat([k for _, k, _ in parts]), torch.cat([v for _, _, v in parts]), slots)
            lengths = [len(prompts[s]) + step + 1 for s in range(len(prompts))]
            out = state.attend(0, torch.cat([q for q, _, _ in parts]), list(range(len(prompts))), lengths,
                               attention.module.scaling)
            ours_steps.append(attention.output(out))
            reference_steps.append(torch.stack([captured[s][1][lengths[s] - 1] for s in range(len(prompts))]))
        sigma = None if sigmas is None else max(float(sigmas[s][len(prompts[s]):].max())
                                                for s in range(len(prompts)))
        checks.append(_check(f"decode: {decode_steps} tokens, one at a time", torch.cat(ours_steps),
                             torch.cat(reference_steps), dtype, sigma))
    return checks


def _check(name: str, ours: torch.Tensor, reference: torch.Tensor, dtype: torch.dtype,
           fp8_sigma: float | None = None) -> Check:
    """``fp8_sigma``: the largest standard deviation the fp8 cache's rounding gives an output of the check."""
    max_err, mean_err = errors(ours, reference)
    tolerance, why = tolerance_for(dtype, reference)
    if fp8_sigma is not None:
        tolerance += FP8_SIGMAS * fp8_sigma
        why += f" + {FP8_SIGMAS} x the fp8 rounding's largest sigma ({fp8_sigma:.3g}, fp8_sigma)"
    return Check(name, max_err, mean_err, tolerance, why)


@torch.no_grad()
def verify_generation(model: Any, prompts: list[list[int]], new_tokens: int, backend: Backend, block_size: int,
                      seed: int, kv_cache_dtype: str = "auto", scale_mode: str = DEFAULT_SCALE_MODE) -> list[Check]:
    """Greedy generation with every layer paged against Hugging Face ``generate`` (greedy, eager attention).

    The paged model is fed Hugging Face's tokens (teacher forcing), so both produce logits for the same context
    at every step: the two generations are identical exactly when the paged model's argmax equals Hugging
    Face's token at every step, and the logit differences compare like with like even where they are not.
    A differing token counts unless Hugging Face itself had a near-tie there (its top two logits closer than
    the logit tolerance), which low precision can resolve either way.
    """
    device = backend.device
    dtype = next(model.parameters()).dtype
    logit_tolerance = _logit_tolerance(dtype)
    why = "largest logit difference over every step, same context on both sides"
    stored = cache_dtype(kv_cache_dtype, dtype)
    references = [model.generate(torch.tensor([prompt], device=device), max_new_tokens=new_tokens, do_sample=False,
                                 min_new_tokens=new_tokens, output_logits=True, return_dict_in_generate=True,
                                 pad_token_id=0) for prompt in prompts]
    reference_tokens = [r.sequences[0, len(p):].tolist() for r, p in zip(references, prompts, strict=True)]
    if stored != dtype:
        sigma = fp8_logit_sigma(lambda run_on: torch.stack(teacher_forced_logits(
            model, prompts, reference_tokens, run_on, block_size, seed)), stored, device, seed)
        logit_tolerance += FP8_SIGMAS * sigma
        why += f"; + {FP8_SIGMAS} x the fp8 rounding's largest logit sigma ({sigma:.3g}, fp8_logit_sigma)"
    ours = teacher_forced_logits(model, prompts, reference_tokens, backend, block_size, seed, stored, scale_mode)
    mismatches, differences = 0, []
    for index, row in enumerate(ours):
        step, sequence = divmod(index, len(prompts))
        reference_row = references[sequence].logits[step][0].float()
        differences.append((row.float() - reference_row).abs())
        token, theirs = int(row.argmax()), reference_tokens[sequence][step]
        if token != theirs and float(reference_row[theirs] - reference_row[token]) > logit_tolerance:
            mismatches += 1
    difference = torch.stack(differences)
    compared = new_tokens * len(prompts)
    return [
        Check(f"generate: {new_tokens} greedy tokens x {len(prompts)} prompts, ids differing", float(mismatches),
              mismatches / compared, 0.0, "greedy token ids must be identical (but at Hugging Face's own near-ties)"),
        Check("generate: logits", float(difference.max()), float(difference.mean()), logit_tolerance, why),
    ]


def teacher_forced_logits(model: Any, prompts: list[list[int]], tokens: list[list[int]], backend: Backend,
                          block_size: int, seed: int, cache: torch.dtype | None = None,
                          scale_mode: str = DEFAULT_SCALE_MODE) -> list[torch.Tensor]:
    """The paged model's logits [vocab] before each of ``tokens`` (fed one step at a time after the prompts),
    step by step, sequence by sequence."""
    total = sum(len(p) for p in prompts) + sum(len(t) for t in tokens)
    paged = PagedQwen3(model, backend, block_size, 2 * (total // block_size + len(prompts)) + 8, seed, cache,
                       scale_mode)
    rows = []
    logits = paged.step(dict(enumerate(prompts)))
    for step in range(len(tokens[0])):
        rows.extend(logits[sequence] for sequence in range(len(prompts)))
        if step + 1 < len(tokens[0]):
            logits = paged.step({s: [t[step]] for s, t in enumerate(tokens)})
    return rows


def _logit_tolerance(dtype: torch.dtype) -> float:
    # fp32 logits sum every layer's fp32 noise (~1e-5 measured). In bf16/fp16 every layer's output differs by
    # about an ulp (see LOW_PRECISION_ULPS) and the residual stream carries them all to the logits (O(1-5)).
    return 1e-3 if dtype == torch.float32 else 32 * torch.finfo(dtype).eps
