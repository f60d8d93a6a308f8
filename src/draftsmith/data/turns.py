"""Where an assistant turn ends, read from the chat template rather than assumed to be eos.

A template may end each assistant turn with a token other than the tokenizer's eos: Gemma's ends
with `<end_of_turn>` (106) while its eos is `<eos>` (1), and a GGUF carries only the eos. One
derivation for every stage that needs the stop set (models convert writes it to
generation_config.json; tokenize closes turns with it; eval, train's eval prompts and the gates stop
decoding at it; engine launch passes it on): render a one-turn conversation whose assistant content
is a probe, and read the first special token that follows the probe, past whitespace only.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

PROBE = "Zq7turnprobe"
# Templates that insist on a system turn, or on the first turn being a user's, get one of these.
_CONVERSATIONS = (
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}],
)


def special_token_ids(tokenizer) -> set[int]:
    """The tokenizer's special ids: its named ones and every added token flagged special (a
    converted GGUF's control tokens, `<end_of_turn>`, are added tokens that no named role holds)."""
    ids = {int(token_id) for token_id in getattr(tokenizer, "all_special_ids", []) or []}
    for token_id, token in (getattr(tokenizer, "added_tokens_decoder", None) or {}).items():
        if getattr(token, "special", False):
            ids.add(int(token_id))
    return ids


def _rendered_turn(tokenizer, template_kwargs: dict[str, Any]) -> str | None:
    if not getattr(tokenizer, "chat_template", None):
        return None
    for prompt in _CONVERSATIONS:
        messages = [*prompt, {"role": "assistant", "content": PROBE}]
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False, **template_kwargs)
        except Exception:  # a template may reject the probe (raise_exception on a role order it wants)
            continue
        if isinstance(text, str) and PROBE in text:
            return text
    return None


def template_end_of_turn_ids(tokenizer, template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """The id the chat template writes right after an assistant turn's content ([] when it writes
    no special token there, has no template, or rejects every probe conversation)."""
    text = _rendered_turn(tokenizer, dict(template_kwargs or {}))
    if text is None:
        return []
    suffix = text.rsplit(PROBE, 1)[1]
    if not suffix:
        return []
    special = special_token_ids(tokenizer)
    for token_id in tokenizer(suffix, add_special_tokens=False)["input_ids"]:
        if int(token_id) in special:
            return [int(token_id)]
        if tokenizer.decode([token_id]).strip():  # text before any special token: no end-of-turn token
            return []
    return []


def _ids(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, Iterable) and not isinstance(value, (str, bytes)):
        return [int(item) for item in value if isinstance(item, int) and not isinstance(item, bool)]
    return []


def end_of_turn_ids(tokenizer, extra: Iterable[int] | int | None = None,
                    template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """Every id that ends a turn, the template's first (the one a finished turn is closed with),
    then `extra` (generation_config.json's eos ids), then the tokenizer's eos; no duplicates."""
    found = [*template_end_of_turn_ids(tokenizer, template_kwargs), *_ids(extra),
             *_ids(getattr(tokenizer, "eos_token_id", None))]
    return list(dict.fromkeys(found))


def generation_eos_ids(tokenizer, extra: Iterable[int] | int | None = None) -> list[int]:
    """generation_config.json's `eos_token_id` for a model folder, a list as released models write
    it (Gemma 3: [1, 106]): the tokenizer's eos and `extra` first, then the template's end of turn."""
    found = [*_ids(getattr(tokenizer, "eos_token_id", None)), *_ids(extra), *template_end_of_turn_ids(tokenizer)]
    return list(dict.fromkeys(found))
