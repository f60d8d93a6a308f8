"""What the audit needs to know about a tokenizer: end-of-turn, role header, scaffolding tokens.

Everything is derived from the tokenizer and its chat template (rendering a probe conversation),
so a Qwen-, Llama- or custom template works without a table of model families.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from draftsmith.core.errors import InputError

_PROBE = "Zq7audit"
_END_OF_TURN_NAMES = ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endofturn|>")


@dataclass
class TokenizerInfo:
    tokenizer: Any
    name: str
    vocab_size: int
    end_of_turn_ids: np.ndarray
    assistant_header: np.ndarray  # token ids that open an assistant turn, e.g. `<|im_start|>assistant\n`
    scaffolding: np.ndarray  # bool[vocab]: special tokens that should never be trained on
    trivial: np.ndarray  # bool[vocab]: tokens with no content (whitespace, special, think delimiters)
    think_open: int | None
    think_close: int | None
    model_max_length: int | None

    def decode(self, token_ids) -> str:
        return self.tokenizer.decode(list(map(int, token_ids)), skip_special_tokens=False)


def load_tokenizer(tokenizer: Any) -> TokenizerInfo:
    """Accept a tokenizer object or a path/name loadable by `AutoTokenizer`."""
    name = getattr(tokenizer, "name_or_path", None) or str(tokenizer)
    if isinstance(tokenizer, (str, Path)):
        from transformers import AutoTokenizer

        from draftsmith.core.paths import dir_or_hub_id

        source = dir_or_hub_id(tokenizer, "--tokenizer")
        try:
            tokenizer = AutoTokenizer.from_pretrained(source)
        except Exception as error:  # transformers raises many types for an unusable dir
            raise InputError(f"{name}: cannot load a tokenizer ({type(error).__name__}: {error})") from None
    return describe_tokenizer(tokenizer, str(name))


def _single_token_id(tokenizer, text: str) -> int | None:
    vocab = tokenizer.get_vocab()
    return vocab.get(text)


def _render(tokenizer, messages, **kwargs) -> str | None:
    if not getattr(tokenizer, "chat_template", None):
        return None
    try:
        return tokenizer.apply_chat_template(messages, tokenize=False, **kwargs)
    except Exception:  # a template may reject the probe (e.g. requires a system turn)
        return None


def describe_tokenizer(tokenizer, name: str = "") -> TokenizerInfo:
    vocab_size = len(tokenizer)
    encode = lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731

    end_of_turn: set[int] = set()
    if tokenizer.eos_token_id is not None:
        end_of_turn.add(int(tokenizer.eos_token_id))
    for text in _END_OF_TURN_NAMES:
        token = _single_token_id(tokenizer, text)
        if token is not None:
            end_of_turn.add(token)
    user = [{"role": "user", "content": "hi"}]
    rendered = _render(tokenizer, user + [{"role": "assistant", "content": _PROBE}])
    if rendered and _PROBE in rendered:
        suffix = rendered.split(_PROBE, 1)[1]
        suffix_ids = encode(suffix) if suffix else []
        if suffix_ids and suffix_ids[0] in set(tokenizer.all_special_ids):
            end_of_turn.add(int(suffix_ids[0]))

    header_text = None
    base = _render(tokenizer, user)
    prompted = _render(tokenizer, user, add_generation_prompt=True)
    if base is not None and prompted is not None and prompted.startswith(base) and len(prompted) > len(base):
        header_text = prompted[len(base):]
        # A template that pre-fills thinking (`<think>\n`) adds it after the header; keep the header.
        for marker in ("<think>",):
            if marker in header_text:
                header_text = header_text.split(marker, 1)[0]
    elif _single_token_id(tokenizer, "<|im_start|>") is not None:
        header_text = "<|im_start|>assistant\n"
    header = np.asarray(encode(header_text) if header_text else [], dtype=np.int64)

    scaffolding = np.zeros(vocab_size, dtype=bool)
    special = [i for i in tokenizer.all_special_ids if 0 <= i < vocab_size]
    scaffolding[special] = True
    scaffolding[[i for i in end_of_turn if i < vocab_size]] = False

    texts = tokenizer.batch_decode([[i] for i in range(vocab_size)], skip_special_tokens=False)
    trivial = np.fromiter((not text.strip() for text in texts), dtype=bool, count=vocab_size)
    trivial[special] = True
    trivial[[i for i in end_of_turn if i < vocab_size]] = True
    think_open = _single_token_id(tokenizer, "<think>")
    think_close = _single_token_id(tokenizer, "</think>")
    for token in (think_open, think_close):
        if token is not None:
            trivial[token] = True

    max_length = getattr(tokenizer, "model_max_length", None)
    if not isinstance(max_length, int) or max_length > 10_000_000:
        max_length = None  # transformers' "unknown" sentinel
    return TokenizerInfo(
        tokenizer=tokenizer,
        name=name,
        vocab_size=vocab_size,
        end_of_turn_ids=np.asarray(sorted(end_of_turn), dtype=np.int64),
        assistant_header=header,
        scaffolding=scaffolding,
        trivial=trivial,
        think_open=think_open,
        think_close=think_close,
        model_max_length=max_length,
    )
