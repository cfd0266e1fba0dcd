"""verify --model-config: a file that is not a Qwen3 config Hugging Face would build, or one too big to build here, is
bad input (one line naming the file, the field and the value, exit 2), not an internal error; a JSON config reads as
JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from minipaged_cli.cli.flags import error_line
from minipaged_cli.cli.main import app
from minipaged_cli.errors import InputError
from tests.conftest import ROOT

pytest.importorskip("transformers")
runner = CliRunner()
SMALL = yaml.safe_load((ROOT / "configs" / "verify" / "qwen3-gqa3-hd64.yaml").read_text())
QUICK = ["--device", "cpu", "--generate", "0", "--decode-steps", "1", "--seq-lens", "5"]


def _verify(tmp_path: Path, config: dict | bytes) -> tuple[int, str, Path]:
    path = tmp_path / "config.json"
    if isinstance(config, bytes):
        path.write_bytes(config)
    else:
        path.write_text(json.dumps(config))
    result = runner.invoke(app, ["verify", "--model-config", str(path), *QUICK])
    return result.exit_code, result.output.strip(), path


@pytest.mark.parametrize(("config", "says"), [
    ({**SMALL, "model_type": "deepseek_v3"}, "model_type: 'deepseek_v3': not a Qwen3 config"),
    ({**SMALL, "layer_types": ["full_attention"]}, "Hugging Face cannot build a Qwen3 from it: "
     "StrictDataclassClassValidationError: ValueError: `num_hidden_layers` (2) must be equal"),
    ({**SMALL, "num_key_value_heads": 5}, "num_key_value_heads: 5: num_attention_heads 12 is not a multiple of it"),
    ({**SMALL, "use_sliding_window": True, "sliding_window": 64, "max_window_layers": 0},
     "layer_types: verify checks full attention"),
    ({**SMALL, "num_attention_heads": 0}, "Hugging Face cannot build a Qwen3 from it: ZeroDivisionError"),
    ({**SMALL, "hidden_size": "big"}, "Hugging Face cannot build a Qwen3 from it: "
     "StrictDataclassFieldValidationError: TypeError: Field 'hidden_size' expected int"),
    ({**SMALL, "intermediate_size": -1}, "Hugging Face cannot build a Qwen3 from it: RuntimeError: Trying to "
     "create tensor with negative dimension -1"),
    ({**SMALL, "hidden_act": "nope"}, "Hugging Face cannot build a Qwen3 from it: KeyError: 'nope'"),
    ({**SMALL, "head_dim": 3}, "head_dim: 3: RoPE needs an even head_dim and a positive theta"),
    ({**SMALL, "rope_theta": 0}, "rope_theta: 0.0: RoPE needs an even head_dim and a positive theta"),
    (b"\xff\xfe\x00{", "cannot read: 'utf-8' codec can't decode"),
])
def test_a_config_verify_cannot_build_is_one_line_exit_2(tmp_path: Path, config: dict | bytes, says: str) -> None:
    exit_code, output, path = _verify(tmp_path, config)
    assert exit_code == 2, output
    assert output.startswith(f"error: {path}: {says}"), output
    assert len(output.splitlines()) == 1, output


def test_a_json_config_reads_as_json(tmp_path: Path) -> None:
    # json.dumps writes rms_norm_eps 1e-06, which YAML 1.1 reads as a string
    exit_code, output, _ = _verify(tmp_path, SMALL)
    assert exit_code == 0, output
    assert "all passed" in output


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_weights_too_big_for_the_free_memory_are_refused(monkeypatch: pytest.MonkeyPatch, dtype: str) -> None:
    # Built in float32 on the host whatever --dtype says (4 B a parameter), then cast a parameter at a time
    import torch

    from minipaged_cli.apps import qwen3

    # The reference count: the same model built for real
    num_params = sum(p.numel() for p in qwen3.build_random_qwen3(SMALL, 0, torch.float32,
                                                                 torch.device("cpu")).parameters())
    monkeypatch.setattr(qwen3, "free_memory_bytes", lambda device: num_params * 4)  # 4 B a parameter: over 80 %
    with pytest.raises(InputError, match=f"{num_params / 1e9:.2f} B parameters need .* on cpu") as error:
        qwen3.build_random_qwen3(SMALL, 0, getattr(torch, dtype), torch.device("cpu"))
    assert error_line(error.value).startswith("--model-config: ")  # (the setting, as the CLI names it)
    monkeypatch.setattr(qwen3, "free_memory_bytes", lambda device: num_params * 4 * 2)
    qwen3.build_random_qwen3(SMALL, 0, getattr(torch, dtype), torch.device("cpu"))  # fits: within 80 %
