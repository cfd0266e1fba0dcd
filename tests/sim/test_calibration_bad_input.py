"""Bad calibration files, GPU presets and Vidur profiles: one line naming the file, the field and the value, exit 2.
A NaN used to pass these checks and hang the replay (``max(now, nan)`` never advances);
a profile row with ``num_tokens`` written ``1.0`` ended in a StopIteration traceback."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from minipaged_cli.apps.vidur import from_vidur
from minipaged_cli.cli.main import app
from minipaged_cli.errors import InputError
from minipaged_cli.sim.calibration import load_calibration
from minipaged_cli.workloads.presets import load_gpu, load_model
from tests.conftest import ROOT

runner = CliRunner()
MIXED = str(ROOT / "traces" / "mixed.yaml")
H100_PROFILE = ROOT / "tests" / "data" / "vidur_h100_llama-2-7b_mlp.csv"
BAD_NUMBERS = [math.nan, math.inf, -math.inf, -1.0, 0.0, "fast", True]


def _calibration() -> dict[str, Any]:
    """A valid calibration with every table (the shipped one has only linear and elementwise)."""
    document = yaml.safe_load((ROOT / "configs" / "calibrations" / "h100-llama-2-7b.yaml").read_text())
    document["prefill_attention"] = {"tokens": [16, 1024], "seconds": [1e-5, 4e-4]}
    document["decode_attention"] = {"batch": [1, 16], "context": [64, 4096], "seconds": [[5e-6, 2e-5], [1e-5, 3e-4]]}
    document["cache_write"] = {"tokens": [1, 1024], "seconds": [2e-6, 3e-5]}
    return document


# Each table's times and sizes, the field as the error names it.
CALIBRATION_FIELDS = [
    (lambda d: d["linear"]["seconds"], 3, "linear.seconds[3]"),
    (lambda d: d["elementwise"]["seconds"], 0, "elementwise.seconds[0]"),
    (lambda d: d["prefill_attention"]["seconds"], 1, "prefill_attention.seconds[1]"),
    (lambda d: d["decode_attention"]["seconds"][1], 0, "decode_attention.seconds[1][0]"),
    (lambda d: d["cache_write"]["seconds"], 1, "cache_write.seconds[1]"),
    (lambda d: d["linear"]["tokens"], 0, "linear.tokens[0]"),
    (lambda d: d["prefill_attention"]["tokens"], 1, "prefill_attention.tokens[1]"),
    (lambda d: d["decode_attention"]["batch"], 1, "decode_attention.batch[1]"),
    (lambda d: d["decode_attention"]["context"], 0, "decode_attention.context[0]"),
]


@pytest.mark.parametrize("value", BAD_NUMBERS, ids=repr)
@pytest.mark.parametrize(("where", "index", "field"), CALIBRATION_FIELDS, ids=[f for _, _, f in CALIBRATION_FIELDS])
def test_a_calibration_number_that_is_not_a_positive_finite_number_is_refused(tmp_path: Path, where, index: int,
                                                                              field: str, value: Any) -> None:
    document = _calibration()
    where(document)[index] = value
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(InputError) as error:
        load_calibration(path)
    assert str(error.value).startswith(f"{path}: {field}: {value!r}: must be ")


def test_a_fraction_of_a_token_in_a_calibration_is_refused(tmp_path: Path) -> None:
    document = _calibration()
    document["linear"]["tokens"][1] = 1.5
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(InputError, match=r"linear.tokens\[1\]: 1.5: must be a whole number"):
        load_calibration(path)


def test_simulate_with_a_nan_in_the_calibration_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "nan.yaml"
    path.write_text((ROOT / "configs" / "calibrations" / "h100-llama-2-7b.yaml").read_text()
                    .replace("seconds: [0.000156,", "seconds: [.nan,", 1))
    result = runner.invoke(app, ["simulate", MIXED, "--gpu", "h100", "--model", "llama-2-7b", "--calibration",
                                 str(path), "--limit", "5"])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [f"error: {path}: linear.seconds[0]: nan: must be a finite number"]


GPU_FIELDS = ["memory_bytes", "hbm_bandwidth_bytes_per_s", "peak_flops", "step_overhead_s",
              "host_bandwidth_bytes_per_s", "gemm_flops_efficiency", "gemm_bandwidth_efficiency",
              "attention_flops_efficiency", "attention_bandwidth_efficiency"]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf, -1.0, "fast", True], ids=repr)
@pytest.mark.parametrize("field", GPU_FIELDS)
def test_a_gpu_preset_number_that_is_not_finite_and_in_range_is_refused(tmp_path: Path, field: str,
                                                                        value: Any) -> None:
    document = yaml.safe_load((ROOT / "configs" / "gpus" / "h100.yaml").read_text())
    document[field] = value
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(document))
    with pytest.raises(InputError) as error:
        load_gpu(str(path))
    assert str(error.value).startswith(f"{path}: {field}: {value!r}: must be ")


@pytest.mark.parametrize(("field", "value", "message"), [
    ("step_overhead_s", 0.0, None),  # no overhead is allowed
    ("gemm_flops_efficiency", 1.0, None),  # the whole peak is allowed
    ("gemm_flops_efficiency", 0.0, "must be > 0"),
    ("attention_bandwidth_efficiency", 1.2, "must be <= 1"),
    ("peak_flops", 0.0, "must be > 0"),
])
def test_a_gpu_presets_ranges(tmp_path: Path, field: str, value: float, message: str | None) -> None:
    document = yaml.safe_load((ROOT / "configs" / "gpus" / "h100.yaml").read_text())
    document[field] = value
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(document))
    if message is None:
        assert getattr(load_gpu(str(path)), field) == value
    else:
        with pytest.raises(InputError, match=f"{field}: {value!r}: {message}"):
            load_gpu(str(path))


def test_simulate_on_a_gpu_with_a_nan_overhead_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "gpu.yaml"
    path.write_text((ROOT / "configs" / "gpus" / "h100.yaml").read_text()
                    .replace("step_overhead_s: 0.0005", "step_overhead_s: .nan"))
    result = runner.invoke(app, ["simulate", MIXED, "--gpu", str(path), "--limit", "5"])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [f"error: {path}: step_overhead_s: nan: must be a finite number"]


def _profile_with(tmp_path: Path, column: str, value: str, row: int = 0) -> Path:
    """The H100 profile with one cell of data row ``row`` replaced by ``value`` (text, as a CSV holds it)."""
    lines = H100_PROFILE.read_text().splitlines()
    header = lines[0].split(",")
    cells = lines[1 + row].split(",")
    cells[header.index(column)] = value
    lines[1 + row] = ",".join(cells)
    path = tmp_path / "mlp.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_a_profile_with_num_tokens_written_as_a_float_converts_as_the_whole_number(tmp_path: Path) -> None:
    # "1.0" is the whole number 1 (validation.whole_number's rule for every reader): the same tables as "1".
    model = load_model("llama-2-7b")
    path = _profile_with(tmp_path, "num_tokens", "1.0")
    written, plain = from_vidur(path, model, "h100"), from_vidur(H100_PROFILE, model, "h100")
    for name in ("linear", "elementwise"):
        assert getattr(written, name).sizes.tolist() == getattr(plain, name).sizes.tolist()
        assert getattr(written, name).seconds.tolist() == getattr(plain, name).seconds.tolist()


@pytest.mark.parametrize(("column", "value", "message"), [
    ("num_tokens", "1.5", "num_tokens: 1.5: must be a whole number"),
    ("num_tokens", "0", "num_tokens: 0: must be >= 1"),
    ("num_tokens", "one", "num_tokens: 'one': must be a whole number"),
    ("num_tokens", "", "num_tokens: '': must be a whole number"),
    ("time_stats.mlp_up_proj.median", "nan", "time_stats.mlp_up_proj.median: nan: must be a finite number"),
    ("time_stats.attn_rope.median", "-0.01", "time_stats.attn_rope.median: -0.01: must be >= 0"),
    ("time_stats.add.median", "inf", "time_stats.add.median: inf: must be a finite number"),
    ("time_stats.mlp_act.median", "x", "time_stats.mlp_act.median: 'x': must be a finite number"),
])
def test_calibrate_from_a_malformed_vidur_row_is_one_line_and_exit_2(tmp_path: Path, column: str, value: str,
                                                                     message: str) -> None:
    path = _profile_with(tmp_path, column, value, row=4)
    result = runner.invoke(app, ["calibrate", str(tmp_path / "out.yaml"), "--model", "llama-2-7b", "--gpu", "h100",
                                 "--from-vidur", str(path)])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [f"error: {path}: row 6: {message}"]
    assert not (tmp_path / "out.yaml").exists()


@pytest.mark.parametrize("row", ["0.038,0.016", "0.038,0.016,0.064,0.038,0.004,0.004,0.004,0.006,0.001,1,1,7"])
def test_calibrate_from_a_vidur_row_of_the_wrong_length_is_one_line_and_exit_2(tmp_path: Path, row: str) -> None:
    lines = H100_PROFILE.read_text().splitlines()
    path = tmp_path / "mlp.csv"
    path.write_text("\n".join([lines[0], lines[1], row]) + "\n")
    result = runner.invoke(app, ["calibrate", str(tmp_path / "out.yaml"), "--model", "llama-2-7b", "--gpu", "h100",
                                 "--from-vidur", str(path)])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [f"error: {path}: row 3: expected 11 cells, as the header names"]
