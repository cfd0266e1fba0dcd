"""Text counted in tokens: by a local tokenizer directory when given (transformers, nothing downloaded), else at
4 characters a token; a bad directory is one line naming --tokenizer."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minipaged_cli.cli.flags import error_line
from minipaged_cli.errors import InputError
from minipaged_cli.workloads.readers import load_trace
from minipaged_cli.workloads.text_tokens import TextTokens


def word_tokenizer(directory: Path) -> Path:
    """A one-token-per-word tokenizer written to ``directory`` (the ``tokenizers`` library builds it offline)."""
    tokenizers = pytest.importorskip("tokenizers")
    pytest.importorskip("transformers")
    vocabulary = {"[UNK]": 0, "hello": 1, "world": 2}
    tokenizer = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocabulary, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    directory.mkdir()
    tokenizer.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast",
                                                                 "unk_token": "[UNK]"}))
    return directory


def test_a_local_tokenizer_counts_sharegpt_text(tmp_path: Path) -> None:
    directory = word_tokenizer(tmp_path / "tok")
    assert TextTokens(directory).count("hello world hello") == 3
    conversations = tmp_path / "c.json"
    conversations.write_text(json.dumps([{"id": "a", "conversations": [
        {"from": "human", "value": "hello world " * 10}, {"from": "gpt", "value": "world " * 7}]}]))
    counted = load_trace(conversations, "sharegpt", tokenizer=directory).sessions[0].turns[0]
    estimated = load_trace(conversations, "sharegpt").sessions[0].turns[0]
    assert (counted.input_tokens, counted.output_tokens) == (20, 7)
    assert (estimated.input_tokens, estimated.output_tokens) == (round(120 / 4), round(42 / 4))


@pytest.mark.parametrize(("make", "message"), [
    (lambda tmp: tmp / "missing", "--tokenizer: "),
    (lambda tmp: tmp, "cannot load a tokenizer from it"),
])
def test_a_bad_tokenizer_directory_is_one_line(tmp_path: Path, make, message: str) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("transformers")
    with pytest.raises(InputError) as error:
        TextTokens(make(tmp_path))
    line = error_line(error.value)  # (the library names the setting, the CLI its flag)
    assert message in line and "\n" not in line
