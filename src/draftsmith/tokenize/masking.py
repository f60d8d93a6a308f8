"""Turn one conversation into `input_ids` + `loss_mask`, exactly, for thinking-model templates.

`loss_mask[i] == 1` means token `input_ids[i]` is a label: it is aligned with `input_ids`, not
shifted (the trainer shifts). One rule for both ways of building a row: the mask is 1 exactly on
what the target generated in the trained assistant turn(s): its think block with the `<think>`
delimiters (even when empty), the answer, and the end-of-turn token. It is 0 on system/user/tool
text, role headers, the newline after an end-of-turn, and anything the template put in the prompt.
The row ends where the generation ended (the final end-of-turn, or the last token written when it
was cut by max_tokens), as an engine's token ids do.

Whether the model wrote a think block is read from the message (`wrote_think_block`): a
`reasoning_content` string, even `""`, says it did (an engine's reasoning parser returns the
block's inside, `""` when it was empty; an inline `<think></think>` in content is split into
`""`); `None` or no field says it did not. A turn without a think block is trained without the
empty `<think>\n\n</think>\n\n` a Qwen3-style template renders for it: that block is template
text, what `enable_thinking=False` pre-fills in the prompt.

How spans are found, without searching for message text in the rendering:

* The turn starts where the template's generation prompt ends: the rendering of the messages
  before it with `add_generation_prompt=True` must be a prefix of the full rendering.
* For a turn without a think block, the scaffold the template inserts before the content is
  measured by rendering the turn with two different one-character probe contents: their common
  part after the generation prompt is template text, skipped when the real rendering starts with it.
* The turn ends at its first end-of-turn token: the one the chat template writes after an assistant
  turn (`data.turns`), `generation_config.json`'s eos ids and the tokenizer's eos.
* Character positions map to tokens through the fast tokenizer's offsets; a boundary falling
  inside a token drops the row instead of shifting the mask.
* Templates with `{% generation %}` markers: the markers' assistant mask is intersected with the
  spans above (so a template that marks its scaffolding, or every turn, cannot leak into the mask).

Every row (or a `verify_share` sample, chosen by id) is verified by decoding the trained tokens:
they must equal the rendered text, end with end-of-turn, end with the content (or contain it,
before Qwen-style `<tool_call>` blocks, which are trained too), contain the reasoning after it,
and be the content alone (after the empty think block, when the model wrote one) when the
reasoning is empty. All-zeros and all-ones masks, a final turn whose reasoning the template
does not render, and a tool call the template does not render (in any turn), are always dropped,
counted by reason.

Which turns: `final` (default) trains the last assistant turn only; it is rendered exactly as the
model saw it when generating, thinking included. `all` trains every assistant turn as the template
renders it in the full conversation: Qwen3-style templates drop the reasoning of turns before the
last user message, so those turns supervise only their answers (text the model produced after a
thinking block that is no longer there).

Rows with engine token ids (`prompt_token_ids` + `completion_token_ids`) skip the template: the
row is exactly what the engine saw and produced, and the completion ids are what the model
generated, so the same rule holds by construction. For the same completion both ways give the same
`input_ids` and `loss_mask` when tokenize renders with the `chat_template_kwargs` generate used
(tests/tokenize/test_tokenize_mask_rule.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from draftsmith.core.errors import InputError
from draftsmith.data.reasoning import THINK_CLOSE, THINK_OPEN
from draftsmith.data.turns import end_of_turn_ids

GENERATION_MARKER = re.compile(r"\{%-?\s*generation\s*-?%\}")
PROBE_CONTENTS = ("A", "B")

# Drop reasons. Policy drops are choices the user made; the others are data or template problems.
POLICY_REASONS = frozenset({"finish_reason_length", "overflow", "truncated_no_trainable", "duplicate_id", "row_too_large"})


def wrote_think_block(message: dict[str, Any]) -> bool:
    """Whether the model wrote a think block in this assistant turn (maybe an empty one)."""
    return message.get("reasoning_content") is not None


def reasoning_of(message: dict[str, Any]) -> str:
    return message.get("reasoning_content") or ""


EMPTY_THINK_BLOCK = re.compile(rf"\s*{re.escape(THINK_OPEN)}\s*{re.escape(THINK_CLOSE)}\s*")


def _check_final_turn(messages: list[dict[str, Any]]) -> None:
    if messages[-1]["role"] != "assistant":
        raise RowDropped("no_assistant_turn", "the conversation does not end with an assistant message")
    final = messages[-1]
    if not (final["content"].strip() or reasoning_of(final).strip() or final.get("tool_calls")):
        raise RowDropped("empty_assistant", "the final assistant message has no content, reasoning or tool calls")


class RowDropped(Exception):
    """This row cannot become a training row; `reason` is a stable key counted in the summary."""

    def __init__(self, reason: str, detail: str):
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


_WHITESPACE = re.compile(r"\s+")


def _check_engine_counts(row: dict[str, Any], prompt: list[int], completion: list[int]) -> None:
    """The engine's usage counts, where the row carries them, must count its token ids: a row whose
    ids were cut, padded or swapped after generation is not trained as if it were whole. An engine
    may count a stop token it leaves out of the ids: one more completion token is consistent."""
    for key, ids, count_key, slack in (("prompt_token_ids", prompt, "prompt_tokens", 0),
                                       ("completion_token_ids", completion, "completion_tokens", 1)):  # fmt: skip
        count = row.get(count_key)
        if isinstance(count, int) and not isinstance(count, bool) and not 0 <= count - len(ids) <= slack:
            raise RowDropped("engine_ids_mismatch", f"{key} holds {len(ids)} ids but {count_key} is {count}")


@dataclass
class MaskedRow:
    id: str
    input_ids: np.ndarray  # int32
    loss_mask: np.ndarray  # int8, aligned with input_ids
    finish_reason: str | None
    method: str  # "template_prefix" | "generation_markers" | "engine_token_ids"
    verified: bool = False
    truncated: bool = False
    end_of_turn_appended: bool = False
    where: str = ""  # file:line of the input row


@dataclass(frozen=True)
class MaskerConfig:
    train_turns: str = "final"  # "final" | "all"
    length_policy: str = "drop"  # "drop" | "keep"
    max_length: int | None = None
    overflow: str = "drop"  # "drop" | "truncate"
    verify_share: float = 1.0
    use_engine_token_ids: bool = True
    use_generation_markers: bool = True
    end_of_turn_tokens: tuple[str, ...] = ()
    chat_template_kwargs: tuple[tuple[str, Any], ...] = ()


def load_tokenizer(tokenizer_path: str | Path):
    """A fast tokenizer with a chat template (offsets are needed to map characters to tokens)."""
    from transformers import AutoTokenizer

    from draftsmith.core.paths import dir_or_hub_id

    source = dir_or_hub_id(tokenizer_path, "--tokenizer")
    try:
        tokenizer = AutoTokenizer.from_pretrained(source)
    except Exception as error:
        raise InputError(f"{tokenizer_path}: cannot load a tokenizer: {error}") from error
    if not getattr(tokenizer, "is_fast", False):
        raise InputError(f"{tokenizer_path}: a fast tokenizer (tokenizer.json) is needed for token offsets")
    if not tokenizer.chat_template:
        raise InputError(f"{tokenizer_path}: the tokenizer has no chat template")
    return tokenizer


def _generation_config_eos(tokenizer_path: str | Path | None) -> list[int]:
    if tokenizer_path is None:
        return []
    from draftsmith.model.target import generation_stop_ids  # torch only when a model dir is given

    return generation_stop_ids(tokenizer_path)


def template_text(tokenizer) -> str:
    template = tokenizer.chat_template
    if isinstance(template, dict):
        template = template.get("default", next(iter(template.values()), ""))
    return template or ""


@contextlib.contextmanager
def _template_errors_drop_the_row() -> Iterator[None]:
    """A chat template that raises on one row (``raise_exception``, a field of the wrong type):
    that row is dropped as ``template_error``, the run goes on."""
    import jinja2

    try:
        yield
    except (jinja2.TemplateError, TypeError, ValueError, KeyError, AttributeError, IndexError) as error:
        message = " ".join(str(error).split()) or type(error).__name__
        raise RowDropped("template_error", f"the chat template raised {type(error).__name__}: {message[:200]}") from None


def special_token_pattern(tokenizer) -> re.Pattern[str] | None:
    """A regex matching the text of every special token of `tokenizer` (its special added tokens, its
    named ones such as eos and pad, and the drafter's `<|MASK|>` when the vocabulary has it), or None."""
    from draftsmith.model.config import MASK_TOKEN

    texts = {str(token) for token in getattr(tokenizer, "all_special_tokens", []) or []}
    for added in (getattr(tokenizer, "added_tokens_decoder", None) or {}).values():
        if getattr(added, "special", False):
            texts.add(str(added.content))
    if MASK_TOKEN in tokenizer.get_vocab():
        texts.add(MASK_TOKEN)
    texts = sorted((t for t in texts if t.strip()), key=len, reverse=True)
    return re.compile("|".join(map(re.escape, texts))) if texts else None


def _should_verify(row_id: str, share: float) -> bool:
    """Deterministic sampling by id, so a rerun verifies the same rows."""
    if share >= 1.0:
        return True
    if share <= 0.0:
        return False
    digest = int.from_bytes(hashlib.blake2b(row_id.encode(), digest_size=8).digest(), "big")
    return digest / 2**64 < share


class ChatMasker:
    """Builds training rows for one tokenizer; create once per process (the template compiles once)."""

    def __init__(self, tokenizer, config: MaskerConfig = MaskerConfig(), tokenizer_path: str | Path | None = None):
        self.tokenizer = tokenizer
        self.config = config
        self.template_kwargs = dict(config.chat_template_kwargs)
        self._row_kwargs: dict[str, Any] = {}
        # The template's own end of turn first: a finished engine row lacking one is closed with it
        # (Gemma's <end_of_turn>, not its <eos>).
        eot_ids = end_of_turn_ids(tokenizer, _generation_config_eos(tokenizer_path), self.template_kwargs)
        for token in config.end_of_turn_tokens:
            token_id = tokenizer.convert_tokens_to_ids(token)
            if token_id is None or token_id == tokenizer.unk_token_id:
                raise InputError(f"end-of-turn token {token!r} is not in the tokenizer's vocabulary")
            eot_ids.append(int(token_id))
        if not eot_ids:
            raise InputError("the tokenizer has no eos token and its chat template writes no special token after "
                             "an assistant turn; pass the end-of-turn token with --end-of-turn")
        self.end_of_turn_ids = frozenset(eot_ids)
        self.primary_end_of_turn = eot_ids[0]
        self.vocab_size = len(tokenizer)
        self.backend = tokenizer.backend_tokenizer
        self.has_generation_markers = bool(GENERATION_MARKER.search(template_text(tokenizer)))
        self.special_text = special_token_pattern(tokenizer)

    @classmethod
    def from_path(cls, tokenizer_path: str | Path, config: MaskerConfig = MaskerConfig()) -> ChatMasker:
        return cls(load_tokenizer(tokenizer_path), config, tokenizer_path)

    def template_record(self) -> dict[str, Any]:
        """What the rows were rendered with: the chat template's sha256 and the template kwargs
        (``enable_thinking``, ...), so a drafter can be checked against its serving template."""
        digest = hashlib.sha256(template_text(self.tokenizer).encode("utf-8")).hexdigest()
        return {"sha256": digest, "kwargs": dict(sorted(self.template_kwargs.items()))}

    # -- public -------------------------------------------------------------------------------

    def build(self, row: dict[str, Any]) -> MaskedRow:
        """The training row for a normalized conversation, or `RowDropped` saying why not."""
        config = self.config
        finish_reason = row.get("finish_reason")
        truncated_generation = finish_reason == "length"
        if truncated_generation and config.length_policy == "drop":
            raise RowDropped("finish_reason_length", "generation hit max_tokens (length policy: drop)")
        verify = _should_verify(row["id"], config.verify_share)
        # The row's tools are part of the context the model saw: every render of this row gets them.
        self._row_kwargs = {"tools": row["tools"]} if row.get("tools") else {}
        _check_final_turn(row["messages"])  # the same rows are dropped whichever way they are built
        self._check_no_special_text(row["messages"])
        if (
            config.use_engine_token_ids
            and row.get("prompt_token_ids")
            and row.get("completion_token_ids")
        ):
            built = self._from_engine_ids(row, verify, truncated_generation)
        else:
            built = self._from_template(row, verify, truncated_generation)
        return self._apply_max_length(built)

    def _check_no_special_text(self, messages: list[dict[str, Any]]) -> None:
        """No message's text holds a special token's text (`<|MASK|>`, `<|endoftext|>`, `<|im_end|>`...).

        The tokenizer turns such text into the special id wherever it stands, so the row would train
        the drafter to emit a mask, an end of text or a role marker in mid-answer (and in a prompt it
        forges a turn boundary). Dropped and counted rather than re-tokenized as plain text: the
        template renders the conversation into one string, and an engine serving it would read the
        same characters as the special id too, so no plain-text form of the row is what is served."""
        if self.special_text is None:
            return
        for index, message in enumerate(messages):
            for key in ("content", "reasoning_content", "reasoning"):
                value = message.get(key)
                found = self.special_text.search(value) if isinstance(value, str) else None
                if found:
                    raise RowDropped("special_token_in_content",
                                     f"messages[{index}].{key} contains the special token text {found.group(0)!r}, "
                                     "which the tokenizer would turn into its special id")

    # -- engine token ids -------------------------------------------------------------------

    def _from_engine_ids(self, row: dict[str, Any], verify: bool, truncated_generation: bool) -> MaskedRow:
        prompt = row["prompt_token_ids"]
        completion = list(row["completion_token_ids"])
        for key, ids in (("prompt_token_ids", prompt), ("completion_token_ids", completion)):
            if min(ids) < 0 or max(ids) >= self.vocab_size:
                raise RowDropped(
                    "engine_ids_invalid",
                    f"{key} has ids outside the tokenizer's vocabulary (size {self.vocab_size}): "
                    "were they produced by another model?",
                )
        _check_engine_counts(row, prompt, completion)
        appended = False
        # A finished turn ends with end-of-turn so the drafter learns to stop; engines differ on
        # whether they return it. A generation cut by max_tokens never produced it.
        if not truncated_generation and completion[-1] not in self.end_of_turn_ids:
            completion.append(self.primary_end_of_turn)
            appended = True
        if verify:
            self._check_engine_prompt(row, prompt)
            final = row["messages"][-1]
            content = final.get("content", "").strip() if final.get("role") == "assistant" else ""
            decoded = self.tokenizer.decode(completion, skip_special_tokens=True)
            if content and content not in decoded:
                raise RowDropped(
                    "engine_ids_mismatch",
                    "completion_token_ids do not decode to the final assistant content",
                )
        input_ids = np.asarray(list(prompt) + completion, dtype=np.int32)
        loss_mask = np.zeros(len(input_ids), dtype=np.int8)
        loss_mask[len(prompt) :] = 1
        return MaskedRow(
            row["id"], input_ids, loss_mask, row.get("finish_reason"), "engine_token_ids",
            verified=verify, end_of_turn_appended=appended,
        )

    def _check_engine_prompt(self, row: dict[str, Any], prompt: list[int]) -> None:
        """The engine's prompt ids must be this row's prompt: its last prompt message's text is in
        their decoding (whitespace aside, which tokenizers may clean up)."""
        text = next((m.get("content") for m in reversed(row["messages"][:-1]) if isinstance(m.get("content"), str)
                     and m.get("content").strip()), None)  # fmt: skip
        if text is None:
            return
        decoded = _WHITESPACE.sub("", self.tokenizer.decode(prompt, skip_special_tokens=False))
        if _WHITESPACE.sub("", text) not in decoded:
            raise RowDropped("engine_ids_mismatch", "prompt_token_ids do not decode to the row's prompt")

    # -- chat template ------------------------------------------------------------------------

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = False) -> str:
        with _template_errors_drop_the_row():
            return self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                **self.template_kwargs, **self._row_kwargs,
            )

    def _empty_reasoning_scaffold(self, before: list[dict[str, Any]], message: dict[str, Any], prompt: str) -> str:
        """Template text between the generation prompt and the content when reasoning is empty."""
        tails = []
        for probe in PROBE_CONTENTS:
            probe_message = {**message, "content": probe, "reasoning_content": ""}
            rendered = self.render(before + [probe_message])
            if not rendered.startswith(prompt):
                return ""
            tails.append(rendered[len(prompt) :])
        common = 0
        for left, right in zip(*tails):
            if left != right:
                break
            common += 1
        return tails[0][:common]

    def _from_template(self, row: dict[str, Any], verify: bool, truncated_generation: bool) -> MaskedRow:
        messages = row["messages"]
        if self.config.train_turns == "all":
            turns = [i for i, message in enumerate(messages) if message["role"] == "assistant" and i > 0]
        else:
            turns = [len(messages) - 1]
        if not turns or turns[-1] == 0:
            raise RowDropped("no_assistant_turn", "the assistant message has no prompt before it")

        text = self.render(messages)
        self._check_tool_calls_rendered(messages, text)
        input_ids, offsets = self._encode(text)
        is_end_of_turn = np.zeros(len(input_ids), dtype=bool)
        for token_id in self.end_of_turn_ids:  # a handful of ids: cheaper than np.isin per row
            is_end_of_turn |= input_ids == token_id
        spans = [(index, *self._turn_span(text, messages, index, offsets, is_end_of_turn)) for index in turns]
        loss_mask = self._span_mask(messages, input_ids, spans)

        # The sequence ends where the generation did, as an engine's ids do: what the template
        # renders after the final end-of-turn (a newline) was never generated. Kept despite
        # hitting max_tokens, the model never wrote what the template closes the turn with either;
        # a think block the model never closed (it stopped inside it) is not closed for it.
        unclosed = bool(row.get("unclosed_think"))
        open_end = truncated_generation or unclosed
        index, first, end = spans[-1]
        if open_end:
            input_ids, offsets, cut, retokenized = self._cut_open_generation(
                text, input_ids, offsets, first, end, messages[-1]
            )
            loss_mask = (
                np.concatenate([loss_mask[:first], np.ones(cut - first, dtype=np.int8)]) if retokenized else loss_mask[:cut]
            )
            spans[-1] = (index, first, cut)
        else:
            input_ids, loss_mask, offsets = input_ids[:end], loss_mask[:end], offsets[:end]

        total = int(loss_mask.sum())
        if total == 0:
            raise RowDropped("mask_all_zeros", "no token is trained in this row")
        if total == len(loss_mask):
            raise RowDropped("mask_all_ones", "every token is trained, the prompt included")
        if verify:
            for index, first, end in spans:
                final_turn = index == len(messages) - 1
                self._verify_turn(
                    text, input_ids, loss_mask, offsets, messages, index, first, end,
                    final_turn=final_turn, closed=not (open_end and final_turn),
                )
        method = "generation_markers" if self.config.use_generation_markers and self.has_generation_markers else "template_prefix"
        built = MaskedRow(row["id"], input_ids, loss_mask, row.get("finish_reason"), method, verified=verify)
        if unclosed and not truncated_generation:
            # It stopped inside its think block: the end-of-turn follows the reasoning directly,
            # as in the engine's ids (the engine path appends it the same way when missing).
            built.input_ids = np.append(input_ids, np.int32(self.primary_end_of_turn)).astype(np.int32)
            built.loss_mask = np.append(loss_mask, np.int8(1)).astype(np.int8)
            built.end_of_turn_appended = True
        return built

    def _check_tool_calls_rendered(self, messages: list[dict[str, Any]], text: str) -> None:
        """Every assistant turn's tool calls appear in what the template renders for that turn.

        A template without tool support (no `tool_calls` branch) renders such a turn as an empty
        message: trained, the call would vanish from the context and the drafter would learn an
        empty turn. The turn's text is what rendering through it adds to rendering up to it, so a
        name that also appears in a system prompt's tool list does not count. `text` is the rendering
        of all of `messages`.
        """
        for index, message in enumerate(messages):
            calls = message.get("tool_calls") if message["role"] == "assistant" else None
            if not calls:
                continue
            through = text if index == len(messages) - 1 else self.render(messages[: index + 1])
            turn_text = through[len(self.render(messages[:index])) :] if index else through
            for call in calls:
                name = (call.get("function") or {}).get("name") or ""
                if name not in turn_text:
                    raise RowDropped(
                        "tool_calls_not_rendered",
                        f"turn {index}: the chat template does not render the tool call {name!r}, so the call would "
                        "be lost from the training text (is this the target model's own template? it must "
                        "render tool_calls)",
                    )

    def _encode(self, text: str) -> tuple[np.ndarray, np.ndarray]:
        """Token ids and character offsets of `text`."""
        # The Rust tokenizer directly: same ids and offsets as tokenizer(text), without the wrapper's
        # per-call overhead (a third of the time per row otherwise).
        encoding = self.backend.encode(text, add_special_tokens=False)
        input_ids = np.asarray(encoding.ids, dtype=np.int32)
        offsets = np.asarray(encoding.offsets, dtype=np.int64).reshape(-1, 2)
        return input_ids, offsets

    def _turn_span(self, text: str, messages, index: int, offsets: np.ndarray, is_end_of_turn: np.ndarray):
        """(first token, end token exclusive) of assistant turn `index` in the rendered `text`."""
        before = messages[:index]
        prompt = self.render(before, add_generation_prompt=True)
        if not text.startswith(prompt):
            raise RowDropped(
                "template_mismatch",
                f"rendering messages[:{index}] with add_generation_prompt=True is not a prefix of "
                "the rendered conversation, so the assistant turn cannot be located"
                + (" (try --train-turns final)" if index != len(messages) - 1 else ""),
            )
        start_char = len(prompt)
        # A think block the model wrote is trained even when empty; one it did not write, yet
        # the template renders, is template text.
        if not wrote_think_block(messages[index]):
            scaffold = self._empty_reasoning_scaffold(before, messages[index], prompt)
            if scaffold and text.startswith(scaffold, start_char):
                start_char += len(scaffold)
        starts = offsets[:, 0]
        first = int(np.searchsorted(starts, start_char, side="left"))
        if first >= len(starts) or starts[first] != start_char or (first > 0 and offsets[first - 1, 1] > start_char):
            raise RowDropped(
                "span_misaligned",
                f"assistant turn {index} starts inside a token (character {start_char}); "
                "the mask would be off by one token",
            )
        later = np.flatnonzero(is_end_of_turn[first:])
        if len(later) == 0:
            raise RowDropped(
                "no_end_of_turn",
                f"assistant turn {index} has no end-of-turn token "
                f"(ids {sorted(self.end_of_turn_ids)}); pass --end-of-turn",
            )
        end = first + int(later[0]) + 1
        final = index == len(messages) - 1
        if final and int(is_end_of_turn[end:].sum()) != 0:
            raise RowDropped(
                "end_of_turn_in_content", "the final assistant turn contains an end-of-turn token inside its text"
            )
        reasoning = reasoning_of(messages[index]).strip()
        if final and reasoning and reasoning not in text[int(offsets[first, 0]) : int(offsets[end - 1, 1])]:
            raise RowDropped(
                "reasoning_not_rendered",
                "the chat template does not render the final turn's reasoning_content, so the "
                "thinking would be lost (is this the target model's own template?)",
            )
        return first, end

    def _span_mask(self, messages, input_ids: np.ndarray, spans: list[tuple[int, int, int]]) -> np.ndarray:
        """1 on the spans' tokens; with generation markers, only where the markers also say so."""
        loss_mask = np.zeros(len(input_ids), dtype=np.int8)
        for _, first, end in spans:
            loss_mask[first:end] = 1
        if self.config.use_generation_markers and self.has_generation_markers:
            markers = self._generation_markers(messages, input_ids)
            for _, first, end in spans:
                turn = markers[first:end].copy()
                turn[end - first - 1] = 1  # the end-of-turn token is always a label
                loss_mask[first:end] = turn
        return loss_mask

    def _generation_markers(self, messages: list[dict[str, Any]], input_ids: np.ndarray) -> np.ndarray:
        with _template_errors_drop_the_row():
            encoded = self.tokenizer.apply_chat_template(
                messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True,
                **self.template_kwargs, **self._row_kwargs,
            )
        if list(encoded["input_ids"]) != input_ids.tolist():
            raise RowDropped(
                "template_mismatch", "the generation-marker rendering differs from the plain rendering"
            )
        return np.asarray(encoded["assistant_masks"], dtype=np.int8)

    def _cut_open_generation(self, text, input_ids, offsets, first: int, end: int, final: dict[str, Any]):
        """The row cut where a generation that never closed its turn ended: before the end-of-turn
        the template added, and (cut inside the reasoning) before the ``</think>`` it added too.
        Returns (input_ids, offsets, cut token index, whether the kept text was re-tokenized)."""
        cut_char = int(offsets[end - 1, 0])  # drop the end-of-turn token the template added
        if not final["content"].strip():
            # Cut inside the reasoning: drop the closing `</think>` scaffold as well.
            reasoning = reasoning_of(final).strip()
            region = text[int(offsets[first, 0]) : cut_char]
            position = region.rfind(reasoning)
            if position >= 0:
                cut_char = int(offsets[first, 0]) + position + len(reasoning)
        cut = int(np.searchsorted(offsets[:, 0], cut_char, side="left"))
        if cut > 0 and offsets[cut - 1, 1] > cut_char:
            # The cut falls inside a token the template's closing text merged into (``.\n``): the
            # engine never produced that token, so tokenize the generated text as it ends.
            prefix_ids, prefix_offsets = self._encode(text[:cut_char])
            if prefix_ids[:first].tolist() != input_ids[:first].tolist():
                raise RowDropped("span_misaligned", "the cut generation re-tokenizes its prompt differently")
            return prefix_ids, prefix_offsets, len(prefix_ids), True
        cut = max(cut, first + 1)
        return input_ids[:cut], offsets[:cut], cut, False

    def _verify_turn(
        self, text, input_ids, loss_mask, offsets, messages, index, first, end, final_turn: bool, closed: bool
    ) -> None:
        """Decode the trained tokens of one turn and check they are exactly the assistant's text."""
        positions = first + np.flatnonzero(loss_mask[first:end])
        decoded = self.backend.decode(input_ids[positions].tolist(), skip_special_tokens=False)
        if len(positions) and positions[-1] - positions[0] + 1 == len(positions):
            rendered = text[int(offsets[positions[0], 0]) : int(offsets[positions[-1], 1])]
        else:  # generation markers may leave gaps inside a turn
            rendered = "".join(text[int(offsets[p, 0]) : int(offsets[p, 1])] for p in positions)
        if decoded != rendered:
            raise RowDropped(
                "verify_failed",
                f"turn {index}: trained tokens decode to {decoded[:60]!r}, the rendered text is {rendered[:60]!r}",
            )
        if first > 0 and loss_mask[first - 1]:
            raise RowDropped("verify_failed", f"turn {index}: the token before the turn is trained")
        body = decoded
        if closed:
            end_text = self.backend.decode([int(input_ids[end - 1])], skip_special_tokens=False)
            if int(input_ids[end - 1]) not in self.end_of_turn_ids or not body.endswith(end_text):
                raise RowDropped("verify_failed", f"turn {index}: trained text does not end with end-of-turn")
            body = body[: -len(end_text)]
        message = messages[index]
        content = message["content"].strip()
        reasoning = reasoning_of(message).strip()
        if not reasoning and wrote_think_block(message):
            # The model's own empty think block is trained; the rest must be the content alone.
            empty_block = EMPTY_THINK_BLOCK.match(body)
            if empty_block:
                body = body[empty_block.end() :]
        # Tool calls are generated text too; templates render them after the content.
        calls = bool(message.get("tool_calls"))
        if closed and content and not calls and not body.rstrip().endswith(content):
            raise RowDropped(
                "verify_failed",
                f"turn {index}: trained text {body[-60:]!r} does not end with the assistant content",
            )
        if closed and content and calls and content not in body:
            raise RowDropped("verify_failed", f"turn {index}: the assistant content is missing from the trained text")
        if final_turn and not reasoning and (
            body.strip() != content if not calls else content and not body.lstrip().startswith(content)
        ):
            raise RowDropped(
                "verify_failed",
                f"turn {index}: with empty reasoning the trained text must start with the content, "
                f"got {body[:60]!r} (template scaffolding leaked into the mask)",
            )
        if final_turn and reasoning:
            position = body.find(reasoning)
            if position < 0:
                raise RowDropped(
                    "verify_failed", f"turn {index}: the reasoning is missing from the trained text"
                )
            if content and body.rfind(content) < position + len(reasoning):
                raise RowDropped("verify_failed", f"turn {index}: the answer does not follow the reasoning")

    # -- length limit -------------------------------------------------------------------------

    def _apply_max_length(self, built: MaskedRow) -> MaskedRow:
        limit = self.config.max_length
        if limit is None or len(built.input_ids) <= limit:
            return built
        if self.config.overflow == "drop":
            raise RowDropped("overflow", f"{len(built.input_ids)} tokens > max length {limit}")
        built.input_ids = built.input_ids[:limit]
        built.loss_mask = built.loss_mask[:limit]
        built.truncated = True
        if not built.loss_mask.any():
            raise RowDropped("truncated_no_trainable", f"no trained token left within max length {limit}")
        return built
