"""Where an fp8 KV cache's scales come from (``--kv-scales``); no torch here, so that the CLI parses it cheaply.

- ``tensor`` (the default): amax / fmax over everything the layer's first write stores, one value for the
  tensor (vLLM's only granularity; its ``calculate_kv_scales`` took it on the first forward pass). Those values
  never saturate, so the relative rounding error bound (2^-4 for e4m3, 2^-3 for e5m2) holds for every one of
  them; later tokens above that amax saturate. ``verify`` calibrates on all the layer will store instead.
- ``head``: the same per kv head (heads whose magnitudes differ keep their own precision).
- ``one``: 1.0, what vLLM uses when a checkpoint carries no calibrated scales. Not the default: an e4m3 cache
  with scale 1 clips every |value| above 448 and flushes every one below 2^-10 to 0, which no precision argument
  bounds (Qwen3's keys after its QK-norm reach hundreds).
"""

from __future__ import annotations

from minipaged_cli.errors import InputError

SCALE_MODES = ("tensor", "head", "one")
DEFAULT_SCALE_MODE = "tensor"


def check_scale_mode(mode: str, field: str = "{kv_scales}") -> str:
    if mode not in SCALE_MODES:
        raise InputError(f"expected one of {', '.join(SCALE_MODES)}", field=field, value=mode, has_value=True)
    return mode
