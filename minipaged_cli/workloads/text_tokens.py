"""Token counts of text, for the formats that hold text instead of counts (AIPerf's turns, ShareGPT): estimated
from characters at a stated ratio, since the tokenizer is the model's and nothing is downloaded."""

from __future__ import annotations

# English text runs at about four characters a token under the BPE tokenizers of Llama, Qwen and GPT models
# (OpenAI's rule of thumb); each text is at least one token.
CHARS_PER_TOKEN = 4.0


def estimated_tokens(text: str) -> int:
    return max(1, round(len(text) / CHARS_PER_TOKEN))
