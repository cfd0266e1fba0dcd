"""The fp8 KV cache: the cache write quantizes, attention dequantizes on read, as vLLM's ``--kv-cache-dtype fp8*``.

A stored element is ``fp8(x / scale)``: x divided in fp32 by its kv head's scale, rounded to nearest even and
saturated to the format's largest finite value (e4m3: +-448, e5m2: +-57344; an infinity saturates too, NaN stays
NaN), which is CUDA's ``__nv_cvt_float_to_fp8(x, __NV_SATFINITE, ...)``. Reading multiplies by the scale again.
Scales are float32 [num_kv_heads] per layer for K and for V: one value repeated (per tensor, vLLM's only mode) or
one per kv head, from the data or 1.0 (``kv_scales.SCALE_MODES``).
"""

from __future__ import annotations

import torch

FP8_DTYPES = {"fp8": torch.float8_e4m3fn, "fp8_e4m3": torch.float8_e4m3fn, "fp8_e5m2": torch.float8_e5m2}


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def cache_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The cache's element type for ``--kv-cache-dtype`` (``auto``: the model's)."""
    return model_dtype if kv_cache_dtype == "auto" else FP8_DTYPES[kv_cache_dtype]


def unit_roundoff(dtype: torch.dtype) -> float:
    """The largest relative rounding error of a normal value: 2^-(mantissa bits + 1) (e4m3: 2^-4, e5m2: 2^-3)."""
    return torch.finfo(dtype).eps / 2


def subnormal_error(dtype: torch.dtype) -> float:
    """The largest absolute rounding error below the normal range, in units of the scale: half the spacing of the
    subnormals (e4m3: 2^-10, e5m2: 2^-17); a value is off by at most max(unit_roundoff |x|, this x scale)."""
    return torch.finfo(dtype).smallest_normal * unit_roundoff(dtype)


def quantize(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """x [..., num_kv_heads, head_dim] / scale [num_kv_heads] -> fp8 of the same shape (saturating, NaN kept)."""
    limit = torch.finfo(dtype).max
    return (x.float() / scale[:, None]).clamp(-limit, limit).to(dtype)


def dequantize(x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """fp8 [..., num_kv_heads, head_dim] -> float32 x scale [num_kv_heads]."""
    return x.float() * scale[:, None]


def amax_scale(x: torch.Tensor, dtype: torch.dtype, per_head: bool) -> torch.Tensor:
    """float32 [num_kv_heads]: amax(|x|) / fmax over x [num_tokens, num_kv_heads, head_dim] (per kv head, or one
    value for all), so that the largest value maps to the format's largest. NaN and inf are left out of the amax
    (they would make every scale NaN or inf); an all-zero tensor gets 1.0."""
    finite = torch.where(torch.isfinite(x), x.float().abs(), 0.0)
    amax = finite.amax(dim=(0, 2)) if per_head else finite.amax().expand(x.shape[1])
    return torch.where(amax > 0, amax / torch.finfo(dtype).max, 1.0).to(torch.float32).contiguous()


FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # what an fp8 cache is written from and read into


def check_against_cache(name: str, tensor: torch.Tensor, key_cache: torch.Tensor) -> None:
    """An fp8 cache takes any of the float dtypes (quantized on write); any other cache only its own."""
    same = tensor.dtype in FLOAT_DTYPES if is_fp8(key_cache.dtype) else tensor.dtype == key_cache.dtype
    if not same or tensor.device != key_cache.device:
        raise ValueError(f"{name} is {tensor.dtype} on {tensor.device}; the cache is {key_cache.dtype} on "
                         f"{key_cache.device}")


def check_scales(key_cache: torch.Tensor, k_scale: torch.Tensor | None, v_scale: torch.Tensor | None) -> None:
    """An fp8 cache needs k_scale and v_scale, float32 [num_kv_heads] on its device, finite and > 0; any other
    cache none."""
    if not is_fp8(key_cache.dtype):
        if k_scale is not None or v_scale is not None:
            raise ValueError(f"k_scale and v_scale are for fp8 caches; this one is {key_cache.dtype}")
        return
    num_kv_heads = key_cache.shape[1]
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if scale is None or scale.shape != (num_kv_heads,) or scale.dtype != torch.float32 \
                or scale.device != key_cache.device or not scale.is_contiguous():
            described = "None" if scale is None else f"{scale.dtype} {list(scale.shape)} on {scale.device}"
            raise ValueError(f"an fp8 cache needs {name} float32 [{num_kv_heads}] on {key_cache.device}, got "
                             f"{described}")
        if not bool((torch.isfinite(scale) & (scale > 0)).all()):
            raise ValueError(f"{name} must be finite and > 0, got {scale.tolist()}")


def stored_rows(key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, k_scale: torch.Tensor | None,
            v_scale: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """key and value as the cache stores them: quantized for an fp8 cache, as they are for any other."""
    if not is_fp8(key_cache.dtype):
        return key, value
    assert k_scale is not None and v_scale is not None, "check_scales lets no fp8 write without scales through"
    return quantize(key, k_scale, key_cache.dtype), quantize(value, v_scale, key_cache.dtype)


def read_rows(rows: torch.Tensor, scale: torch.Tensor | None) -> torch.Tensor:
    """Cached rows [..., num_kv_heads, head_dim] in fp32, dequantized when the cache is fp8 (``scale`` given)."""
    return rows.float() if scale is None else dequantize(rows, scale)
