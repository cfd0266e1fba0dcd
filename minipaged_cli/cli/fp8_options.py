"""The option beside ``--kv-cache-dtype`` that ``run`` and ``verify`` share: where an fp8 cache's scales come from."""

from __future__ import annotations

from typing import Annotated

import typer

from minipaged_cli.dataplane.kv_scales import SCALE_MODES

KvScalesOption = Annotated[str, typer.Option(
    "--kv-scales", help=f"An fp8 KV cache's scales ({', '.join(SCALE_MODES)}): amax / the format's largest value per "
                        "tensor or per kv head, taken at each layer's first write, or 1.0 as vLLM without calibrated "
                        "checkpoint scales.")]
