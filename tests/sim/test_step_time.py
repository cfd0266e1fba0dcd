"""The step-time model: worked by hand, against measured GEMM profiles (microsoft/vidur, ``tests/data/``), and
the calibration files and command that replace it with measurements."""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import yaml
from typer.testing import CliRunner

from minipaged_cli.apps.calibrate import FULL_GRID, QUICK_GRID, coverage, full_grid
from minipaged_cli.apps.vidur import from_vidur
from minipaged_cli.cli.main import app
from minipaged_cli.sim.calibration import Calibration, Grid, Table, load_calibration
from minipaged_cli.sim.config import SimConfig
from minipaged_cli.sim.step_time import StepTimeModel
from minipaged_cli.workloads.presets import load_gpu, load_model
from tests.conftest import ROOT

runner = CliRunner()
DATA = ROOT / "tests" / "data"
H100_PROFILE = DATA / "vidur_h100_llama-2-7b_mlp.csv"
A100_PROFILE = DATA / "vidur_a100-80gb_llama-2-7b_mlp.csv"
MIXED = str(ROOT / "traces" / "mixed.yaml")


def test_a_decode_step_worked_by_hand() -> None:
    # Llama-2-7B on the H100 preset, 8 sequences decoding with 1,000 tokens of context each.
    model, gpu = load_model("llama-2-7b"), load_gpu("h100")
    layer = 4096 * (2 * 4096 + 2 * 4096) + 3 * 4096 * 11008  # QKV + O, gate/up/down: 202,375,168 weights
    head = 32000 * 4096
    kv_per_token = 2 * 32 * 32 * 128 * 2  # K and V, 32 layers, 32 heads of 128, fp16: 524,288 bytes
    flops, hbm = 989e12 * 0.84, 3.35e12 * 0.90  # the preset's GEMM efficiencies
    # Element-wise, per token and layer: two fused add + RMSNorms (hidden and residual in, both out), RoPE on Q and
    # K (in and out), SiLU(gate) * up (two in, one out): 82,176 fp16 values.
    elementwise = 2 * 4 * 4096 + 2 * (4096 + 4096) + 3 * 11008
    expected = (32 * (8 * 2 * layer / flops + 2 * layer / hbm)  # weight GEMMs of 8 tokens
                + 32 * 8 * elementwise * 2 / (3.35e12 * 0.80)  # element-wise kernels, memory-bound
                + 8 * 2 * head / flops + 2 * head / hbm  # LM head: 8 rows of logits
                + 8 * 1000 * kv_per_token / (3.35e12 * 0.80)  # decode attention reads every token's K/V
                + 8 * kv_per_token / (3.35e12 * 0.80)  # cache writes of the 8 new tokens
                + 0.0005)  # the step's overhead
    seconds = StepTimeModel(model, gpu).step_seconds(new_tokens=8, sequences=8, decodes=8, decode_context=8000)
    assert seconds == pytest.approx(expected, rel=1e-12)
    assert 0.006 < expected < 0.007  # weight-bound: 13.5 GB of fp16 weights at 3 TB/s


def test_a_prefill_step_worked_by_hand() -> None:
    # One 1,024-token prompt, computed from scratch: attention over 1024 * 1025 / 2 (query, key) pairs.
    model, gpu = load_model("llama-2-7b"), load_gpu("h100")
    step = StepTimeModel(model, gpu)
    pairs = 1024 * 1025 / 2
    attention = pairs * 4 * 32 * 32 * 128 / (989e12 * 0.60)  # QK^T and PV, a multiply-add each, every layer
    seconds = step.step_seconds(new_tokens=1024, sequences=1, prefill_tokens=1024, prefill_attended=pairs,
                                prefill_context=1024)
    no_attention = step.step_seconds(new_tokens=1024, sequences=1)
    assert seconds - no_attention == pytest.approx(attention, rel=1e-12)


@pytest.mark.parametrize("calibrated", [False, True])
def test_a_run_of_decode_steps_at_once_matches_one_step_at_a_time(calibrated: bool) -> None:
    model, gpu = load_model("llama-2-7b"), load_gpu("h100")
    calibration = _synthetic_calibration(model) if calibrated else None
    step = StepTimeModel(model, gpu, calibration)
    contexts = 12 * 700 + 12 * np.arange(1, 40)
    bulk = step.step_seconds(new_tokens=12, sequences=12, decodes=12, decode_context=contexts)
    single = [float(step.step_seconds(new_tokens=12, sequences=12, decodes=12, decode_context=int(c)))
              for c in contexts]
    np.testing.assert_allclose(bulk, single, rtol=1e-12)


@pytest.mark.parametrize("calibrated", [False, True])
def test_a_step_asked_again_costs_what_a_fresh_model_says(calibrated: bool) -> None:
    # The terms of a step's new tokens are kept by their count (``step_seconds``); every step, asked again in any
    # order and with other contexts, is the float a model asked once computes.
    model, gpu = load_model("llama-2-7b"), load_gpu("h100")
    calibration = _synthetic_calibration(model) if calibrated else None
    step = StepTimeModel(model, gpu, calibration)
    rng = np.random.default_rng(3)
    for tokens, context, chunk in zip(rng.integers(1, 200, 300).tolist(), rng.integers(1, 10**6, 300).tolist(),
                                      rng.integers(0, 2, 300).tolist(), strict=True):
        shape = dict(new_tokens=tokens, sequences=1 + tokens // 7, decodes=tokens // 7, decode_context=context,
                     prefill_tokens=tokens * chunk, prefill_attended=tokens * chunk * 3.5, prefill_context=tokens)
        fresh = StepTimeModel(model, gpu, calibration).step_seconds(**shape)
        assert step.step_seconds(**shape) == fresh


def _synthetic_calibration(model):  # type: ignore[no-untyped-def]
    return Calibration(
        gpu="h100", model=model, source="test",
        linear=Table(np.array([1.0, 64, 512]), np.array([1e-4, 2e-4, 1e-3])),
        prefill_attention=Table(np.array([16.0, 1024]), np.array([1e-5, 4e-4])),
        decode_attention=Grid(np.array([1.0, 16]), np.array([64.0, 4096]),
                              np.array([[5e-6, 2e-5], [1e-5, 3e-4]])),
        cache_write=Table(np.array([1.0, 1024]), np.array([2e-6, 3e-5])))


def test_interpolation_is_linear_inside_and_shaped_beyond() -> None:
    table = Table(np.array([10.0, 20.0]), np.array([1.0, 3.0]))
    assert float(table(15)) == pytest.approx(2.0)
    assert float(table(40)) == pytest.approx(6.0)  # by default twice the last point's tokens, twice its time
    assert float(table(40, shape=lambda n: n * n)) == pytest.approx(12.0)  # a quadratic term: four times
    assert float(table(40, shape=lambda n: n + 20)) == pytest.approx(4.5)  # a constant part: 60 / 40 of the time
    np.testing.assert_allclose(table(np.array([15.0, 40.0]), shape=lambda n: n * n), [2.0, 12.0])
    assert float(table(1)) == pytest.approx(1.0)
    grid = Grid(np.array([1.0, 3.0]), np.array([10.0, 20.0]), np.array([[1.0, 2.0], [3.0, 6.0]]))
    assert float(grid(2, 15)) == pytest.approx((1.5 + 4.5) / 2)
    assert float(grid(6, 20)) == pytest.approx(12.0)


def test_a_prompt_past_the_calibrations_longest_costs_the_square_of_its_length() -> None:
    # The case: a calibration measured up to 8,192-token prompts, asked for a 65,536-token one. Llama-2-7B
    # on an H100 is compute-bound there (FLOPs 0.93 ms a layer, K/V read 0.05 ms), so causal attention's time
    # grows with the (query, key) pairs: 65,536 * 65,537 / (8,192 * 8,193) = 63.99 times, not 8 times.
    model, gpu = load_model("llama-2-7b"), load_gpu("h100")
    last = 2e-3  # seconds a layer at 8,192 tokens
    calibration = Calibration(gpu="h100", model=model, source="test",
                              linear=Table(np.array([1.0, 8192]), np.array([1e-4, 1e-3])),
                              prefill_attention=Table(np.array([1024.0, 8192]), np.array([5e-5, last])))
    step = StepTimeModel(model, gpu, calibration)

    def one_prompt(n: int) -> float:
        return float(step.prefill_attention_seconds(n, n * (n + 1) / 2, n))

    assert one_prompt(8192) == pytest.approx(32 * last, rel=1e-12)
    assert one_prompt(65536) / one_prompt(8192) == pytest.approx(65536 * 65537 / (8192 * 8193), rel=1e-12)
    # A 16,384-token chunk attending to 16,384 more tokens of context: its pairs at the 16,384-token prompt's rate.
    pairs = 16384 * 16384 + 16384 * 16385 / 2
    rate = (16384 * 16385 / 2) / (32 * last * 16384 * 16385 / (8192 * 8193))
    assert float(step.prefill_attention_seconds(16384, pairs, 32768)) == pytest.approx(pairs / rate, rel=1e-12)


def test_gemms_past_the_calibrations_largest_grow_as_the_efficiency_model_does() -> None:
    # Twice the shipped H100 table's last 4,096 tokens: the weight-reading part does not double.
    model, gpu = load_model("llama-2-7b"), load_gpu("h100")
    calibration = load_calibration(ROOT / "configs" / "calibrations" / "h100-llama-2-7b.yaml")
    layer = 4096 * (2 * 4096 + 2 * 4096) + 3 * 4096 * 11008

    def efficiency(tokens: int) -> float:  # one layer, by hand: FLOPs at 0.84 of peak, weights at 0.9 of HBM
        return tokens * 2 * layer / (989e12 * 0.84) + 2 * layer / (3.35e12 * 0.90)

    last = float(calibration.linear.seconds[-1])
    expected = 32 * last * efficiency(8192) / efficiency(4096)
    assert float(StepTimeModel(model, gpu, calibration).linear_seconds(8192)) == pytest.approx(expected, rel=1e-12)
    assert 1.9 < expected / (32 * last) < 1.99


# -- against measured profiles --------------------------------------------------------------------------------


def _profile(path: Path, gpu: str) -> tuple[np.ndarray, np.ndarray]:
    linear = from_vidur(path, load_model("llama-2-7b"), gpu).linear
    assert linear is not None
    return linear.sizes, linear.seconds


def _in_ranges(tokens: np.ndarray) -> np.ndarray:
    """The validated shapes (benchmarks/step_time_validation.py's): batch 1-128 decode, 512-4,096-token prefill."""
    return (tokens <= 128) | ((tokens >= 512) & (tokens <= 4096))


@pytest.mark.parametrize(("gpu", "path", "largest", "median"), [
    ("h100", H100_PROFILE, 0.17, 0.07),
    ("a100-80gb", A100_PROFILE, 0.20, 0.13),
])
def test_the_presets_efficiency_model_follows_measured_gemm_times(gpu: str, path: Path, largest: float,
                                                                  median: float) -> None:
    model, spec = load_model("llama-2-7b"), load_gpu(gpu)
    tokens, measured = _profile(path, gpu)
    keep = _in_ranges(tokens)
    efficiency = StepTimeModel(model, spec).linear_seconds(tokens[keep]) / model.num_layers
    error = np.abs(efficiency / measured[keep] - 1)
    assert error.max() <= largest and np.median(error) <= median
    # The datasheet roofline it replaces is short by a fifth or more: why step times needed fixing.
    roofline = np.maximum(2 * model.layers_params / model.num_layers * tokens[keep] / spec.peak_flops,
                          model.layers_params / model.num_layers * 2 / spec.hbm_bandwidth_bytes_per_s)
    assert np.all(roofline < measured[keep] * 0.82) and np.median(roofline / measured[keep]) < 0.76


@pytest.mark.parametrize(("gpu", "path"), [("h100", H100_PROFILE), ("a100-80gb", A100_PROFILE)])
def test_a_calibration_predicts_profiled_shapes_it_did_not_see_within_10_percent(gpu: str, path: Path) -> None:
    model, spec = load_model("llama-2-7b"), load_gpu(gpu)
    tokens, measured = _profile(path, gpu)
    seen = np.arange(len(tokens)) % 2 == 0
    seen[-1] = True
    calibration = Calibration(gpu=gpu, model=model, source="every other row",
                              linear=Table(tokens[seen], measured[seen]))
    unseen = ~seen & _in_ranges(tokens)
    predicted = StepTimeModel(model, spec, calibration).linear_seconds(tokens[unseen]) / model.num_layers
    error = np.abs(predicted / measured[unseen] - 1)
    # GEMM times step up at tile boundaries (512 -> 520 tokens: +32 % on the H100); a grid twice as coarse as
    # the profile misses two such edges by 12-13 %. Every other shape is within 10 %.
    assert np.mean(error <= 0.10) >= 0.97 and error.max() <= 0.15 and np.median(error) <= 0.02


def _column_sums(path: Path, columns: list[str]) -> dict[int, float]:
    """Naively: per token count, the median over its rows of the columns' sum, in seconds."""
    sums: dict[int, list[float]] = {}
    with open(path, newline="") as file:
        for row in csv.DictReader(file):
            sums.setdefault(int(row["num_tokens"]), []).append(sum(float(row[c]) for c in columns) / 1e3)
    return {tokens: float(np.median(values)) for tokens, values in sums.items()}


GEMM_COLUMNS = [f"time_stats.{op}.median" for op in ("attn_pre_proj", "attn_post_proj", "mlp_up_proj",
                                                        "mlp_down_proj")]
ELEMENTWISE_COLUMNS = [f"time_stats.{op}.median" for op in ("input_layernorm", "post_attention_layernorm",
                                                               "attn_rope", "mlp_act", "add")]


@pytest.mark.parametrize(("name", "path"), [("h100-llama-2-7b", H100_PROFILE),
                                             ("a100-80gb-llama-2-7b", A100_PROFILE)])
def test_the_shipped_calibrations_are_the_profiles_rows(name: str, path: Path) -> None:
    shipped = load_calibration(ROOT / "configs" / "calibrations" / f"{name}.yaml")
    assert shipped.linear is not None and shipped.same_shapes(load_model("llama-2-7b"))
    for table, columns in ((shipped.linear, GEMM_COLUMNS), (shipped.elementwise, ELEMENTWISE_COLUMNS)):
        expected = _column_sums(path, columns)
        assert table is not None
        np.testing.assert_array_equal(table.sizes, sorted(expected))
        np.testing.assert_allclose(table.seconds, [expected[int(n)] for n in table.sizes], rtol=1e-5)
    assert "microsoft/vidur" in shipped.source


def test_a_calibrated_prefill_pays_the_profiles_norms_rope_activation_and_add() -> None:
    # Vidur's H100 profile at 2,048 tokens: 0.1795 and 0.18 ms a layer in two rows (norms 0.026 + 0.028, RoPE
    # 0.041, SiLU 0.07, add 0.0145), 32 layers: 5.75 ms of the 2,048-token prefill's 44.1 ms in Vidur.
    model, gpu = load_model("llama-2-7b"), load_gpu("h100")
    calibration = load_calibration(ROOT / "configs" / "calibrations" / "h100-llama-2-7b.yaml")
    step = StepTimeModel(model, gpu, calibration)
    assert float(step.elementwise_seconds(2048)) == pytest.approx(32 * (0.1795 + 0.18) / 2 / 1e3, rel=1e-4)
    with_them = step.step_seconds(new_tokens=2048, sequences=1)
    without = StepTimeModel(model, gpu, replace(calibration, elementwise=None)).step_seconds(new_tokens=2048,
                                                                                              sequences=1)
    assert with_them - without == pytest.approx(5.752e-3 - 32 * 2048 * 164352 / (3.35e12 * 0.80), rel=1e-4)
    # A decode step of one sequence: 0.019 ms a layer, 0.61 ms a step, where fused kernels would need 0.002 ms.
    assert float(step.elementwise_seconds(1)) == pytest.approx(32 * 0.019e-3, rel=1e-4)


def test_a_calibration_of_another_model_scales_by_the_efficiency_models_ratio() -> None:
    measured_model, gpu = load_model("llama-2-7b"), load_gpu("h100")
    calibration = load_calibration(ROOT / "configs" / "calibrations" / "h100-llama-2-7b.yaml")
    target = load_model("qwen3-8b")
    for tokens in (1, 256, 4096):
        efficiency_ratio = (StepTimeModel(target, gpu).linear_seconds(tokens) / target.num_layers) / \
            (StepTimeModel(measured_model, gpu).linear_seconds(tokens) / measured_model.num_layers)
        expected = target.num_layers * float(calibration.linear(tokens)) * efficiency_ratio
        assert float(StepTimeModel(target, gpu, calibration).linear_seconds(tokens)) == pytest.approx(expected)


# -- files and commands ---------------------------------------------------------------------------------------


def _write(path: Path, document: dict) -> Path:
    path.write_text(yaml.safe_dump(document))
    return path


def _valid() -> dict:
    return yaml.safe_load((ROOT / "configs" / "calibrations" / "h100-llama-2-7b.yaml").read_text())


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d["linear"]["tokens"].__setitem__(2, 1), "linear.tokens[2]: 1: must increase"),
    (lambda d: d["linear"]["seconds"].pop(), "linear.seconds: '258 values': expected a list of 259 times"),
    (lambda d: d["linear"]["seconds"].__setitem__(0, -1.0), "linear.seconds[0]: -1.0: must be > 0"),
    (lambda d: d.pop("linear"), "linear: missing"),
    (lambda d: d.__setitem__("gpu", "a100-80gb"), "gpu: 'a100-80gb': measured on 'a100-80gb', not on --gpu 'h100'"),
    (lambda d: d.__setitem__("tables", {}), "tables: unknown key"),
])
def test_a_bad_calibration_file_is_one_line_naming_the_file_field_and_value(tmp_path: Path, edit, message) -> None:
    document = _valid()
    edit(document)
    path = _write(tmp_path / "bad.yaml", document)
    result = runner.invoke(app, ["simulate", MIXED, "--gpu", "h100", "--calibration", str(path), "--limit", "5"])
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines() == [f"error: {path}: {message}" + result.output.split(message)[1]
                                                  .rstrip()]


def test_simulate_with_a_calibration_names_it_and_runs_slower_steps(tmp_path: Path) -> None:
    args = ["simulate", MIXED, "--model", "llama-2-7b", "--gpu", "h100", "--strategies", "paged",
            "--max-model-len", "4096", "--json", "-"]
    plain = runner.invoke(app, args)
    calibrated = runner.invoke(app, [*args, "--calibration", str(ROOT / "configs/calibrations/h100-llama-2-7b.yaml")])
    assert plain.exit_code == 0 and calibrated.exit_code == 0, plain.output + calibrated.output
    assert "step times: h100's efficiency model" in plain.stderr
    assert "step times: calibration h100-llama-2-7b.yaml (linear, elementwise)" in calibrated.stderr
    plain_json, calibrated_json = json.loads(plain.stdout), json.loads(calibrated.stdout)
    assert plain_json["config"]["watermark"] == 0.0  # vLLM v1's default
    assert calibrated_json["config"]["calibration"].endswith("h100-llama-2-7b.yaml")
    # Decode GEMMs of small batches take 16 % longer measured than the efficiency model says (1 token: 156 vs 135 µs).
    assert calibrated_json["strategies"]["paged"]["mean_tpot_s"] > plain_json["strategies"]["paged"]["mean_tpot_s"]


@pytest.mark.slow
def test_calibrate_measures_on_the_cpu_and_simulate_reads_what_it_wrote(tmp_path: Path) -> None:
    # What calibrate owes its user, on the machine's own clock: a file simulate reads, positive times of the
    # grid's shapes. How the times order by size is the fake clock's test below: a busy machine can reorder them.
    out = tmp_path / "cpu.yaml"
    result = runner.invoke(app, ["calibrate", str(out), "--model", "qwen3-0.6b", "--gpu", "h200", "--device", "cpu",
                                 "--dtype", "float32", "--quick", "--repeat", "1", "--json", str(tmp_path / "c.json")])
    assert result.exit_code == 0, result.output
    calibration = load_calibration(out)
    assert calibration.gpu == "h200" and calibration.same_shapes(load_model("qwen3-0.6b"))
    grid = QUICK_GRID
    for table, sizes in ((calibration.linear, grid.linear_tokens), (calibration.elementwise, grid.elementwise_tokens),
                         (calibration.prefill_attention, grid.prefill_tokens), (calibration.cache_write,
                                                                                 grid.write_tokens)):
        assert table is not None and table.sizes.tolist() == list(sizes) and np.all(table.seconds > 0)
    assert calibration.decode_attention is not None and calibration.decode_attention.seconds.shape == (2, 2)
    assert np.all(calibration.decode_attention.seconds > 0)
    # The quick grid stops at 128-token prompts; Qwen3-0.6B's context is 40,960 tokens: the command says so.
    assert "note: prefill_attention measured up to 128 tokens of the model's 40,960" in result.stderr
    comparison = json.loads((tmp_path / "c.json").read_text())["comparison"]
    first_linear = next(row for row in comparison if row["table"] == "linear")
    assert first_linear["measured_us"] == pytest.approx(calibration.linear.seconds[0] * 1e6, rel=1e-4)
    config = SimConfig.of(model=load_model("qwen3-0.6b"), gpu=load_gpu("h200"), num_blocks=64, calibration=calibration)
    step = StepTimeModel(config.model, config.gpu, config.calibration)
    assert float(step.linear_seconds(64)) == pytest.approx(28 * float(calibration.linear(64)))
    simulated = runner.invoke(app, ["simulate", MIXED, "--model", "qwen3-0.6b", "--gpu", "h200", "--calibration",
                                    str(out), "--limit", "5", "--json", "-"])
    assert simulated.exit_code == 0, simulated.output
    assert json.loads(simulated.stdout)["config"]["calibration"] == str(out)


class _FakeDevice:
    """A deterministic device clock: a kernel call on ``size`` units costs ``size`` µs, and the first
    ``COLD_CALLS`` calls of a kernel at a size cost a second more each (the warm-up a real device pays, as in the
    3.2 ms a CPU once timed for one token's element-wise work, ten times 64 tokens' 0.32 ms)."""

    COLD_CALLS = 2

    def __init__(self) -> None:
        self.now = 0.0
        self.calls: dict[tuple[object, int], int] = {}

    def work(self, kernel: object, size: int) -> None:
        calls = self.calls[kernel, size] = self.calls.get((kernel, size), 0) + 1
        self.now += size * 1e-6 + (1.0 if calls <= self.COLD_CALLS else 0.0)


@pytest.mark.slow
@pytest.mark.parametrize("repeat", [1, 3])
def test_calibrate_tables_are_the_timed_calls_at_their_sizes_without_the_warm_up(monkeypatch, repeat: int) -> None:
    torch = pytest.importorskip("torch")
    from minipaged_cli.apps import calibrate as calibrate_app
    from minipaged_cli.dataplane.backends import TorchBackend

    device = _FakeDevice()
    linear, sdpa, activation = (torch.nn.functional.linear, torch.nn.functional.scaled_dot_product_attention,
                                calibrate_app._activation)

    def fake_linear(x, weight):  # type: ignore[no-untyped-def]
        device.work(("linear", tuple(weight.shape)), x.shape[0])  # one kernel per weight matrix
        return linear(x, weight)

    def fake_sdpa(q, k, v, **kwargs):  # type: ignore[no-untyped-def]
        device.work("prefill", q.shape[2])
        return sdpa(q, k, v, **kwargs)

    def fake_activation(gate, up, gated):  # type: ignore[no-untyped-def]
        device.work("elementwise", gate.shape[0])
        return activation(gate, up, gated)

    class FakeBackend(TorchBackend):
        def clock(self) -> float:
            return device.now

        def _paged_attention(self, query, key_cache, value_cache, block_tables, seq_lens, scale, k_scale,
                             v_scale):  # type: ignore[no-untyped-def]
            device.work("decode", int(seq_lens.sum()))
            return torch.empty_like(query)

        def _cache_write(self, key, value, key_cache, value_cache, slot_mapping, k_scale,
                         v_scale):  # type: ignore[no-untyped-def]
            device.work("write", slot_mapping.numel())

    monkeypatch.setattr(torch.nn.functional, "linear", fake_linear)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", fake_sdpa)
    monkeypatch.setattr(calibrate_app, "_activation", fake_activation)
    grid = QUICK_GRID
    calibration = calibrate_app.measure(load_model("qwen3-0.6b"), "h200", FakeBackend("cpu"), torch.float32, grid,
                                        repeat=repeat)
    # Each table: 1 µs a unit, sizes in the grid's order, and no call that paid the cold second.
    us = 1e-6
    assert calibration.linear.seconds == pytest.approx(4 * us * np.array(grid.linear_tokens))  # QKV, O, up, down
    assert calibration.elementwise.seconds == pytest.approx(us * np.array(grid.elementwise_tokens))
    assert calibration.prefill_attention.seconds == pytest.approx(us * np.array(grid.prefill_tokens))
    assert calibration.cache_write.seconds == pytest.approx(us * np.array(grid.write_tokens))
    batch, context = np.meshgrid(grid.decode_batch, grid.decode_context, indexing="ij")
    assert calibration.decode_attention.seconds == pytest.approx(us * batch * context)
    assert list(device.calls.values()) == [_FakeDevice.COLD_CALLS + repeat] * len(device.calls)


def test_a_gpu_file_of_ones_own_sets_the_efficiencies(tmp_path: Path) -> None:
    document = yaml.safe_load((ROOT / "configs" / "gpus" / "h100.yaml").read_text())
    document["gemm_flops_efficiency"] = 1.5
    path = _write(tmp_path / "mine.yaml", document)
    result = runner.invoke(app, ["simulate", MIXED, "--gpu", str(path), "--limit", "5"])
    assert result.exit_code == 2
    assert "gemm_flops_efficiency: 1.5: must be <= 1" in result.output


def test_the_full_grid_reaches_the_models_context_length() -> None:
    qwen, llama = load_model("qwen3-8b"), load_model("llama-2-7b")  # 40,960 and 4,096 tokens of context
    assert full_grid(qwen).prefill_tokens[-4:] == (8192, 16384, 32768, 40960)
    assert full_grid(qwen).decode_context[-4:] == (8192, 16384, 32768, 40960)
    assert full_grid(llama) == FULL_GRID  # 8,192 already covers it


@pytest.mark.slow
def test_calibrate_stops_prefill_where_the_device_runs_out_of_memory_and_says_so(monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    from minipaged_cli.apps import calibrate as calibrate_app
    from minipaged_cli.dataplane.backends import TorchBackend

    sdpa = torch.nn.functional.scaled_dot_product_attention

    def small_device(q, k, v, **kwargs):  # type: ignore[no-untyped-def]
        if q.shape[2] > 64:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory")
        return sdpa(q, k, v, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", small_device)
    # A K/V pool of 256 tokens: a batch of 4 x 128 tokens shares blocks among its sequences.
    monkeypatch.setattr(calibrate_app, "MAX_POOL_BYTES", 256 * 2 * 8 * 128 * 4)
    model = load_model("qwen3-0.6b")
    grid = replace(QUICK_GRID, prefill_tokens=(16, 64, 256, 1024), decode_batch=(1, 4), decode_context=(16, 128))
    calibration = calibrate_app.measure(model, "h200", TorchBackend("cpu"), torch.float32, grid, repeat=1)
    assert calibration.prefill_attention is not None
    assert calibration.prefill_attention.sizes.tolist() == [16, 64]
    assert calibration.source.endswith("; prefill attention stopped at 256 tokens: out of device memory")
    assert calibration.decode_attention is not None and np.all(calibration.decode_attention.seconds > 0)
    assert coverage(calibration)[0] == ("prefill_attention measured up to 64 tokens of the model's 40,960: longer "
                                        "ones follow the efficiency model's shape")
