"""Bad input for KV offloading's commands (run --cpu-kv-memory, profile --offload, calibrate --gpu-out): one line
naming the option and the value, exit 2."""

from __future__ import annotations

import pytest

from tests.cli.test_bad_input_scheduling import BURST, one_line_error
from tests.conftest import ROOT

VIDUR = str(ROOT / "tests" / "data" / "vidur_h100_llama-2-7b_mlp.csv")


@pytest.mark.parametrize(("args", "needle"), [
    (["run", BURST, "--device", "cpu", "--cpu-kv-memory", "-1GiB"], "--cpu-kv-memory: '-1GiB': expected a size"),
    (["run", BURST, "--device", "cpu", "--cpu-kv-memory", "nan"], "--cpu-kv-memory: 'nan': expected a size"),
    (["run", BURST, "--device", "cpu", "--cpu-kv-memory", "1GiB", "--offload-policy", "write-back"],
     "--offload-policy: 'write-back': expected one of write-through, on-eviction"),
    (["run", BURST, "--device", "cpu", "--cpu-kv-memory", "1GiB", "--scheduler", "v0"], "--cpu-kv-memory"),
    (["profile", BURST, "--offload", "--device", "none"], "--device: 'none': timing KV offloading needs a device"),
    (["calibrate", "out.yaml", "--model", "llama-2-7b", "--gpu", "h100", "--from-vidur", VIDUR, "--gpu-out", "g.yaml"],
     "--gpu-out: 'g.yaml': needs the host link measured"),
])
def test_offload_options(args: list[str], needle: str) -> None:
    assert needle in one_line_error(args)
