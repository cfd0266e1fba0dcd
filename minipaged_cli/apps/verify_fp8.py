"""The fp8 KV cache's error model for ``minipaged verify``: how far e4m3's (or e5m2's) rounding moves each attention
output and each logit, derived from the format's precision and the data, never from the fp8 run's own error."""

from __future__ import annotations

from collections.abc import Callable

import torch

from minipaged_cli.dataplane.backends import Backend, TorchBackend
from minipaged_cli.dataplane.fp8 import subnormal_error, unit_roundoff

# An fp8 cache adds its rounding, which fp8_sigma propagates (first order) from the stored K and V to each output
# element as a standard deviation; the check allows this many of them beyond the tolerance above. The rounding
# errors of a layer's thousands of stored elements are independent and enter every output through sums of
# hundreds of terms, so each output's error is close to normal: 6 sigma is exceeded with probability 2e-9 per
# element, about 1e-4 over a check's 1e5 elements, while a misplaced token or a wrong scale moves outputs by
# O(1) of their magnitude (tens of sigma).
FP8_SIGMAS = 6


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
        key, value = ((x * (1 + self.unit * (2 * torch.rand(x.shape, generator=self.generator, device=x.device) - 1)))
                      .to(x.dtype) for x in (key, value))  # in the model's dtype, as the cache holds it
        super()._cache_write(key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale)


@torch.no_grad()
def fp8_logit_sigma(logits: Callable[[Backend], torch.Tensor], cache: torch.dtype, device: torch.device,
                    seed: int) -> float:
    """The largest standard deviation of a compared logit that fp8's rounding causes in the teacher-forced
    generation ``logits(backend)`` [compared rows, vocab] (same prompts and tokens, over that backend): no closed
    form carries fp8_sigma's per-layer error through the later layers (their MLPs and attention read the
    perturbed residual stream, and every layer's error is correlated across positions and features), so the
    paged model itself does. It generates FP8_LOGIT_SAMPLES
    times over PerturbedWrites (fp8's error model, drawn from a seeded generator), and once unperturbed; the
    root-mean-square deviation of each logit estimates its sigma. The fp8 run's own error is not used."""
    clean = logits(TorchBackend(device))
    squares = sum((logits(PerturbedWrites(device, unit_roundoff(cache), seed + sample)) - clean) ** 2
                  for sample in range(FP8_LOGIT_SAMPLES))
    return float((squares / FP8_LOGIT_SAMPLES).sqrt().max())
