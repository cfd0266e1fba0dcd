"""``verify --kv-cache-dtype``: the fp8 error model against a brute-force simulation of it, the paged Qwen3 over an
fp8 cache within the tolerance that model derives (and not within the unquantized one), and bad input."""

from __future__ import annotations

import pytest
import torch
from typer.testing import CliRunner

from minipaged_cli.apps.qwen3 import build_random_qwen3, load_config_file
from minipaged_cli.apps.verify import fp8_sigma, make_prompts, verify_generation, verify_layer
from minipaged_cli.cli.main import app
from minipaged_cli.dataplane.backends import TorchBackend
from minipaged_cli.dataplane.emulation import EmulatedBackend

runner = CliRunner()


def test_fp8_sigma_matches_a_simulation_of_its_error_model() -> None:
    # The brute-force reference: perturb every K and V element by a relative error uniform in +-2^-4 (e4m3's
    # rounding, at its worst spread), run causal attention and o_proj exactly, 400 times; the standard
    # deviation of each output must be what fp8_sigma's first-order propagation says (within the sampling
    # error of 400 draws, ~7 %, and the second-order terms the formula drops).
    generator = torch.Generator().manual_seed(0)
    tokens, q_heads, kv_heads, head_dim, hidden = 12, 4, 2, 16, 24
    q = torch.randn(tokens, q_heads, head_dim, generator=generator) * 2
    k = torch.randn(tokens, kv_heads, head_dim, generator=generator) * 2
    v = torch.randn(tokens, kv_heads, head_dim, generator=generator)
    o_proj = torch.randn(hidden, q_heads * head_dim, generator=generator) / 8
    scale, u = head_dim ** -0.5, 2.0 ** -4
    ones = torch.ones(kv_heads) * 1e-6  # scales so small that the subnormal term vanishes

    def attend(keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
        keys, values = (x.double().repeat_interleave(2, 1).transpose(0, 1) for x in (keys, values))
        logits = scale * q.double().transpose(0, 1) @ keys.transpose(1, 2)
        logits = logits.masked_fill(torch.ones(tokens, tokens, dtype=torch.bool).triu(1), float("-inf"))
        out = torch.softmax(logits, -1) @ values  # [heads, T, D]
        return out.transpose(0, 1).reshape(tokens, -1) @ o_proj.double().T

    exact = attend(k, v)
    draws = torch.stack([attend(k * (1 + u * (2 * torch.rand(k.shape, generator=generator) - 1)),
                                v * (1 + u * (2 * torch.rand(v.shape, generator=generator) - 1))) - exact
                         for _ in range(400)])
    simulated = draws.pow(2).mean(0).sqrt()
    predicted = fp8_sigma(q, k, v, scale, o_proj, torch.float8_e4m3fn, ones, ones).double()
    torch.testing.assert_close(predicted, simulated, rtol=0.2, atol=0)


@pytest.fixture(scope="module")
def model() -> object:
    return build_random_qwen3(load_config_file("qwen3-gqa3-hd64"), 0, torch.float32, torch.device("cpu"))


@pytest.mark.parametrize("kv_cache_dtype", ["fp8_e4m3"])  # e5m2's rounding is tested in tests/dataplane/test_fp8.py
def test_an_fp8_cache_passes_within_its_derived_tolerance_and_needs_it(model, kv_cache_dtype: str) -> None:
    # (Seed 5: with seed 4's prompts this model's fp32 generation already differs from Hugging Face on main.)
    prompts = make_prompts([30, 7], model.config.vocab_size, seed=5)
    checks = verify_layer(model, 1, prompts, 3, TorchBackend(), 16, 5, kv_cache_dtype=kv_cache_dtype)
    checks += verify_generation(model, prompts, 3, TorchBackend(), 16, 5, kv_cache_dtype)
    assert all(c.passed for c in checks), [(c.name, c.max_abs_err, c.tolerance) for c in checks]
    for check in (checks[0], checks[1], checks[3]):  # prefill, decode, logits
        assert check.max_abs_err > 1e-3, check.name  # fp8 really rounds: far beyond fp32's own 1e-4


def test_a_broken_slot_still_fails_over_an_fp8_cache(model) -> None:
    # The fp8 tolerance is wide enough for the rounding, not for a token written to another's slot.
    prompts = make_prompts([20, 9], model.config.vocab_size, seed=2)
    prefill = verify_layer(model, 1, prompts, 0, TorchBackend(), 16, 2, corrupt="offset-slot",
                           kv_cache_dtype="fp8_e4m3")[0]
    assert not prefill.passed and prefill.max_abs_err > 3 * prefill.tolerance


@pytest.mark.parametrize(("arguments", "field"), [(["--kv-cache-dtype", "fp9"], "--kv-cache-dtype"),
                                                  (["--kv-cache-dtype", "fp8", "--kv-scales", "max"], "--kv-scales")])
def test_bad_fp8_options_exit_2(arguments: list[str], field: str) -> None:
    result = runner.invoke(app, ["verify", "--generate", "0", *arguments])
    assert result.exit_code == 2, result.output
    assert field in result.output and "Traceback" not in result.output


def test_a_backend_without_fp8_refuses_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    # The CUDA kernels on an A100 (sm_80): the emulation of that GPU refuses as the real one would.
    monkeypatch.setattr("minipaged_cli.dataplane.select.select_backend",
                        lambda device: EmulatedBackend(capability=(8, 0)))
    result = runner.invoke(app, ["verify", "--device", "emulated", "--kv-cache-dtype", "fp8_e4m3"])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and "emulated" in lines[0] and "sm_89" in lines[0], result.output


def test_a_bfloat16_model_over_an_fp8_cache() -> None:
    # The error model's perturbed writes stay in the model's dtype (a bf16 cache takes nothing else).
    model = build_random_qwen3(load_config_file("qwen3-gqa3-hd64"), 0, torch.bfloat16, torch.device("cpu"))
    prompts = make_prompts([12, 5], model.config.vocab_size, seed=5)
    checks = verify_generation(model, prompts, 2, TorchBackend(), 16, 5, "fp8_e4m3")
    assert all(c.passed for c in checks), [(c.name, c.max_abs_err, c.tolerance) for c in checks]
