"""``minipaged verify``: the paged Qwen3 path against Hugging Face transformers' Qwen3 (eager attention)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from minipaged_cli.apps.qwen3 import apply_rope, build_random_qwen3, load_config_file
from minipaged_cli.apps.verify import make_prompts, verify_generation, verify_layer
from minipaged_cli.cli.main import app
from minipaged_cli.dataplane.backends import TorchBackend

SHAPES = ["qwen3-0.6b-4-layers", "qwen3-gqa3-hd64"]  # 16 q / 8 kv, head_dim 128; 12 q / 4 kv, head_dim 64
runner = CliRunner()


@pytest.fixture(scope="module")
def models() -> dict[str, object]:
    return {name: build_random_qwen3(load_config_file(name), 0, torch.float32, torch.device("cpu"))
            for name in SHAPES}


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [1, 16, 128])  # 128: one block holds a whole prompt
@pytest.mark.parametrize("which_layer", ["first", "last"])
@pytest.mark.parametrize("shape", SHAPES)
def test_layer_matches_hugging_face(models: dict, shape: str, which_layer: str, block_size: int) -> None:
    model = models[shape]
    layer = 0 if which_layer == "first" else len(model.model.layers) - 1
    prompts = make_prompts([37, 5, 64], model.config.vocab_size, seed=1)
    checks = verify_layer(model, layer, prompts, decode_steps=4, backend=TorchBackend(), block_size=block_size,
                          seed=1)
    assert [c.name.split(":")[0] for c in checks] == ["prefill", "decode"]
    for check in checks:
        assert check.passed, (check.name, check.max_abs_err)
        assert check.tolerance == 1e-4  # fp32


@pytest.mark.slow
@pytest.mark.parametrize("corrupt", ["swap-blocks", "offset-slot"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_broken_block_table_or_slot_fails(corrupt: str, dtype: torch.dtype) -> None:
    # A verifier that cannot fail proves nothing: swap two entries of one block table, or write two tokens to
    # each other's slots, and the prefill check must fail.
    model = build_random_qwen3(load_config_file(SHAPES[1]), 0, dtype, torch.device("cpu"))
    prompts = make_prompts([37, 5, 64], model.config.vocab_size, seed=2)
    prefill = verify_layer(model, 1, prompts, decode_steps=0, backend=TorchBackend(), block_size=16, seed=2,
                           corrupt=corrupt)[0]
    assert not prefill.passed
    assert prefill.max_abs_err > 10 * prefill.tolerance


@pytest.mark.slow
def test_bfloat16_passes_within_its_derived_bound() -> None:
    model = build_random_qwen3(load_config_file(SHAPES[1]), 0, torch.bfloat16, torch.device("cpu"))
    prompts = make_prompts([20, 9], model.config.vocab_size, seed=3)
    checks = verify_layer(model, 0, prompts, 3, TorchBackend(), 16, 3) + \
        verify_generation(model, prompts, 4, TorchBackend(), 16, 3)
    assert all(c.passed for c in checks), [(c.name, c.max_abs_err, c.tolerance) for c in checks]
    assert checks[0].tolerance > 1e-4  # derived from bf16's eps, not fp32's


@pytest.mark.slow
def test_paged_generation_equals_hugging_face_generate(models: dict) -> None:
    model = models[SHAPES[0]]
    prompts = make_prompts([12, 30, 3], model.config.vocab_size, seed=4)
    tokens, logits = verify_generation(model, prompts, 6, TorchBackend(), block_size=4, seed=4)
    assert tokens.max_abs_err == 0 and tokens.passed
    assert logits.max_abs_err < 1e-4


def test_rope_rotates_pairs_by_position_times_frequency() -> None:
    # head_dim 4, theta 100: frequencies 1 and 1/10; position 2 turns pair (x0, x2) by 2 rad, (x1, x3) by 0.2 rad.
    x = torch.tensor([[[1.0, 2.0, 3.0, 4.0]]])
    out = apply_rope(x, torch.tensor([2]), theta=100.0)[0, 0]
    angle0, angle1 = torch.tensor(2.0), torch.tensor(0.2)
    expected = torch.stack([1 * angle0.cos() - 3 * angle0.sin(), 2 * angle1.cos() - 4 * angle1.sin(),
                            3 * angle0.cos() + 1 * angle0.sin(), 4 * angle1.cos() + 2 * angle1.sin()])
    torch.testing.assert_close(out, expected)


@pytest.mark.slow
def test_verify_a_saved_checkpoint(tmp_path: Path) -> None:
    model = build_random_qwen3(load_config_file(SHAPES[1]), 7, torch.float32, torch.device("cpu"))
    model.save_pretrained(tmp_path, safe_serialization=True)
    assert list(tmp_path.glob("*.safetensors"))
    result = runner.invoke(app, ["verify", "--model-path", str(tmp_path), "--layer", "1", "--seq-lens", "9,20",
                                 "--decode-steps", "2", "--generate", "3", "--json", "-"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert set(document) == {"layer", "dtype", "device", "backend", "kv_cache_dtype", "checks", "passed"}
    assert document["passed"] and document["layer"] == 1 and document["dtype"] == "float32"
    assert all(set(c) == {"name", "max_abs_err", "mean_abs_err", "tolerance", "passed"} for c in document["checks"])
    assert len(document["checks"]) == 4


def test_pickle_weights_are_refused(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen3"}))
    (tmp_path / "pytorch_model.bin").write_bytes(b"not loaded")
    result = runner.invoke(app, ["verify", "--model-path", str(tmp_path)])
    assert result.exit_code == 2
    assert "pickle weights (pytorch_model.bin), which are refused" in result.stderr


@pytest.mark.slow
def test_a_failing_check_exits_1_with_a_failed_table(monkeypatch: pytest.MonkeyPatch) -> None:
    import minipaged_cli.apps.verify as verify

    original = verify.verify_layer
    monkeypatch.setattr(verify, "verify_layer", lambda *a, **k: original(*a, **k, corrupt="offset-slot"))
    result = runner.invoke(app, ["verify", "--model-config", SHAPES[1], "--generate", "0"])
    assert result.exit_code == 1
    assert "FAILED" in result.stdout and "FAIL" in result.stdout
    assert "FAILED" in result.stderr


@pytest.mark.parametrize(("args", "needle"), [
    (["--layer", "9"], "--layer: 9: the model has layers 0..1"),
    (["--seq-lens", "3,x"], "--seq-lens: '3,x'"),
    (["--dtype", "int8"], "--dtype: 'int8'"),
    (["--model-config", "nope"], "--model-config: 'nope': no such config"),
])
def test_verify_bad_input(args: list[str], needle: str) -> None:
    result = runner.invoke(app, ["verify", "--model-config", SHAPES[1], *args])
    assert result.exit_code == 2
    assert needle in result.stderr and len(result.stderr.strip().splitlines()) == 1
