"""Token counts of text, for the formats that hold text instead of counts (AIPerf's turns, ShareGPT): counted by
a tokenizer in a local directory when one is given (transformers; nothing is downloaded), else estimated from
characters at a stated ratio."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from minipaged_cli.errors import InputError
from minipaged_cli.extras import needs

# English text runs at about four characters a token under the BPE tokenizers of Llama, Qwen and GPT models
# (OpenAI's rule of thumb); each text is at least one token.
CHARS_PER_TOKEN = 4.0


class TextTokens:
    """``count(text)``: its tokens under the tokenizer of ``tokenizer_dir`` (a model's directory with
    ``tokenizer.json`` or the files its tokenizer class reads), or ``len(text) / CHARS_PER_TOKEN`` without one;
    at least 1."""

    def __init__(self, tokenizer_dir: Path | None = None) -> None:
        self.tokenizer: Any = None
        if tokenizer_dir is None:
            return
        if not Path(tokenizer_dir).is_dir():
            raise InputError("no such directory; expected a local tokenizer's", field="{tokenizer}",
                             value=str(tokenizer_dir), has_value=True)
        try:
            from transformers import AutoTokenizer
        except ModuleNotFoundError:
            raise InputError(needs("transformers"), field="{tokenizer}") from None
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir), local_files_only=True)
        except (OSError, ValueError) as error:
            first = (str(error).splitlines() or [type(error).__name__])[0]
            raise InputError(f"cannot load a tokenizer from it: {first}", field="{tokenizer}",
                             value=str(tokenizer_dir), has_value=True) from None

    def count(self, text: str) -> int:
        if self.tokenizer is None:
            return max(1, round(len(text) / CHARS_PER_TOKEN))
        return max(1, len(self.tokenizer.encode(text, add_special_tokens=False)))


ESTIMATED = TextTokens()
