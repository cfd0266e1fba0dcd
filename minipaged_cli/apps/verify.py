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
from minipaged_cli.dataplane.backends import Backend, TorchBackend
from minipaged_cli.dataplane.block_tables import append_slots
from minipaged_cli.dataplane.fp8 import cache_dtype, subnormal_error, unit_roundoff
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
# An fp8 cache adds its rounding, which fp8_sigma propagates (first order) from the stored K and V to each output
# element as a standard deviation; the check allows this many of them beyond the tolerance above. The rounding
# errors of a layer's thousands of stored elements are independent and enter every output through sums of
# hundreds of terms, so each output's error is close to normal: 6 sigma is exceeded with probability 2e-9 per
# element, about 1e-4 over a check's 1e5 elements, while a misplaced token or a wrong scale moves outputs by
# O(1) of their magnitude (tens of sigma).
FP8_SIGMAS = 6


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


def fp8_sigma(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float, o_proj: torch.Tensor,
              cache: torch.dtype, k_scale: torch.Tensor, v_scale: torch.Tensor) -> torch.Tensor:
    """The standard deviation of each attention output (after o_proj) that an fp8 cache's rounding causes, to first
    order, for one sequence attending causally: query [T, q heads, D], key, value [T, kv heads, D] (what the cache
    is given), o_proj [hidden, q heads x D], per-kv-head scales -> [T, hidden].

    A stored element x comes back as x (1 + e) + f: e relative, |e| <= u (2^-4 for e4m3: round to nearest with 3
    mantissa bits), f the subnormals' absolute error, |f| <= eta x scale (eta = 2^-10 for e4m3); as rounding
    errors they are independent, zero-mean, and at most uniform over their range: variance <= u^2 x^2 / 3 and
    eta^2 scale^2 / 3. Then, for query q of head h and positions j <= t:

    - a logit l_j = s q.k_j moves by dl_j = s sum_i q_i dk_ji;
    - softmax: dp_j = p_j (dl_j - sum_k p_k dl_k), so the output o = sum_j p_j v_j moves by
      do = sum_j p_j dl_j (v_j - o) + sum_j p_j dv_j;
    - o_proj: dy_r = sum_(h, d) W_r,hd do_hd = sum_h sum_j p_hj [dl_hj B_r,hj + sum_d W_r,hd dv_jd] with
      B_r,hj = sum_d W_r,hd (v_jd - o_hd).

    The query heads of one GQA group read the same dk and dv, so their terms are correlated: the variance sums
    over pairs (h, h') of the group, Var(dy_r) = sum_(h,h') sum_j p_hj p_h'j [s^2 (sum_i q_hi q_h'i Var(dk_ji))
    B_r,hj B_r,h'j + sum_d W_r,hd W_r,h'd Var(dv_jd)]. Nothing here is measured: it follows from the format's
    precision and the magnitudes of q, K, V and W.
    """
    u2, eta2 = unit_roundoff(cache) ** 2 / 3, subnormal_error(cache) ** 2 / 3
    num_tokens, num_q_heads, head_dim = query.shape
    num_kv_heads = key.shape[1]
    group = num_q_heads // num_kv_heads
    q, k, v = query.float(), key.float(), value.float()
    w = o_proj.float().view(-1, num_q_heads, head_dim)  # [hidden, q heads, D]
    future = torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=q.device).triu(1)
    variance = torch.zeros(num_tokens, w.shape[0], device=q.device)
    for kv_head in range(num_kv_heads):
        keys, values = k[:, kv_head], v[:, kv_head]  # [T, D]
        key_var = u2 * keys ** 2 + eta2 * float(k_scale[kv_head]) ** 2  # Var(dk_ji)
        value_var = u2 * values ** 2 + eta2 * float(v_scale[kv_head]) ** 2
        heads = range(kv_head * group, (kv_head + 1) * group)
        probs = {h: torch.softmax((scale * q[:, h] @ keys.T).masked_fill(future, float("-inf")), -1) for h in heads}
        value_w = {h: values @ w[:, h].T for h in heads}  # [T, hidden]: v_j . W_h
        out_w = {h: (probs[h] @ values) @ w[:, h].T for h in heads}  # [T, hidden]: o_t . W_h
        for h in heads:
            for h2 in heads:
                pairs = probs[h] * probs[h2]  # [T, T]
                a = scale ** 2 * pairs * ((q[:, h] * q[:, h2]) @ key_var.T)  # logit covariance x p p'
                variance += (a @ (value_w[h] * value_w[h2]) - out_w[h2] * (a @ value_w[h])
                             - out_w[h] * (a @ value_w[h2]) + out_w[h] * out_w[h2] * a.sum(-1, keepdim=True))
                variance += pairs @ (value_var @ (w[:, h] * w[:, h2]).T)
    return variance.clamp(min=0).sqrt()


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
        raise InputError(f"the model has layers 0..{num_layers - 1}", field="--layer", value=layer, has_value=True)
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
            raise InputError("swap-blocks needs a prompt longer than one block", field="--seq-lens")
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
        sigma = fp8_logit_sigma(model, prompts, reference_tokens, stored, block_size, device, seed)
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


FP8_LOGIT_SAMPLES = 8  # generations over a cache perturbed by fp8's error model


class PerturbedWrites(TorchBackend):
    """The torch backend over a cache of the model's dtype whose writes carry fp8's error model instead of fp8's
    rounding: every element x is stored as x (1 + u e), e uniform in [-1, 1] and independent (``unit_roundoff``
    u; the subnormals' absolute floor, below 1e-5 of the amax, is left out)."""

    def __init__(self, device: torch.device, unit: float, seed: int) -> None:
        super().__init__(device)
        self.unit = unit
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def _cache_write(self, key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor,
                     value_cache: torch.Tensor, slot_mapping: torch.Tensor, k_scale: torch.Tensor | None,
                     v_scale: torch.Tensor | None) -> None:
        key, value = (x * (1 + self.unit * (2 * torch.rand(x.shape, generator=self.generator, device=x.device) - 1))
                      for x in (key, value))
        super()._cache_write(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale)


@torch.no_grad()
def fp8_logit_sigma(model: Any, prompts: list[list[int]], tokens: list[list[int]], cache: torch.dtype,
                    block_size: int, device: torch.device, seed: int) -> float:
    """The largest standard deviation of a compared logit that fp8's rounding causes in the teacher-forced
    generation (same prompts, same tokens): no closed form carries fp8_sigma's per-layer error through the
    later layers (their MLPs and attention read the perturbed residual stream, and every layer's error is
    correlated across positions and features), so the paged model itself does. It generates FP8_LOGIT_SAMPLES
    times over PerturbedWrites (fp8's error model, drawn from a seeded generator), and once unperturbed; the
    root-mean-square deviation of each logit estimates its sigma. The fp8 run's own error is not used."""
    def logits(backend: Backend) -> torch.Tensor:
        return torch.stack(teacher_forced_logits(model, prompts, tokens, backend, block_size, seed))

    clean = logits(TorchBackend(device))
    squares = sum((logits(PerturbedWrites(device, unit_roundoff(cache), seed + sample)) - clean) ** 2
                  for sample in range(FP8_LOGIT_SAMPLES))
    return float((squares / FP8_LOGIT_SAMPLES).sqrt().max())


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
