"""Memory sizes as users write them (``12GiB``, ``500MB``, ``1073741824``), and measurements as JSON documents
carry them (``rounded``)."""

from __future__ import annotations

import re

from minipaged_cli.errors import InputError

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


def parse_bytes(text: str, *, field: str = "{kv_memory}", allow_zero: bool = False) -> int:
    """``"12GiB"`` -> 12884901888. Decimal (GB) and binary (GiB) units; a bare number is bytes. ``allow_zero``:
    0 is a size (a tier turned off)."""
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise InputError(
            "expected a size such as 12GiB, 500MB or 1073741824", field=field, value=text, has_value=True
        )
    size = int(float(match.group(1)) * _UNITS[unit])
    if size < 0 or (size == 0 and not allow_zero):
        raise InputError("must be positive", field=field, value=text, has_value=True)
    return size


def format_bytes(num_bytes: float) -> str:
    """Binary units, three significant digits: 12884901888 -> '12.0 GiB'."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.3g} {unit}"
    return f"{num_bytes:.0f} B"


JSON_DECIMALS = 6


def rounded(values: dict[str, object]) -> dict[str, object]:
    """A report's measurements for ``--json``: floats rounded to JSON_DECIMALS decimals, the rest as they are."""
    return {key: round(value, JSON_DECIMALS) if isinstance(value, float) else value for key, value in values.items()}
