"""Audit conversation / generated rows (contract 1) before they are tokenized.

Rows are parsed one at a time (JSON parsing dominates; there is no per-token work). Unreadable
rows become error lines naming file and line and count as bad samples; the audit goes on.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from draftsmith.audit.report import EXAMPLES, GATED_CHECKS, INFO_CHECKS, AuditReport, Check, Dominant, duplicate_prompts
from draftsmith.audit.thresholds import Thresholds, coerce_thresholds
from draftsmith.audit.tokens import load_tokenizer
from draftsmith.core.errors import InputError
from draftsmith.data.conversation import Conversation, parse_conversation
from draftsmith.data.sources import iter_records, resolve

MAX_ERRORS = 50
CHUNK = 16384
PENDING = 4096
TOP_PER_CHUNK = 32
#: finish reasons that mean the model ended its turn on its own
NORMAL_STOPS = {"stop", "eos", "end_turn", "stop_sequence", "tool_calls", "function_call"}


def _digest(value: Any) -> int:
    data = value if isinstance(value, bytes) else json.dumps(value, sort_keys=True, ensure_ascii=False).encode()
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little")


def _int_or_none(value: Any) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


class _ConversationAccumulator:
    def __init__(self, tokenizer, max_context: int | None):
        self.info = tokenizer
        self.max_context = max_context
        self.samples = 0
        self.bad = 0
        self.errors: list[str] = []
        self.errors_total = 0
        self.ids: list[str] = []
        self.token_lengths: list[int] = []  # -1 when unknown
        self.char_lengths: list[int] = []
        self.prompt_lengths: list[int] = []  # -1 when unknown
        self.pending: list[tuple[int, str | None, list | None, list | None]] = []
        self.completion_hashes: list[int] = []
        self.prompt_hashes: list[int] = []
        self.empty: list[bool] = []
        self.chunk_texts: dict[int, str] = {}
        self.chunk_hashes: list[int] = []
        self.texts: dict[int, str] = {}
        self.any_finish_reason = False
        tokenized_only = {"scaffolding_masked", "prompt_masked", "length_mismatch", "trainable_count_mismatch"}
        self.checks = {
            name: Check(name) for name in GATED_CHECKS + INFO_CHECKS if name not in tokenized_only
        }

    def error(self, message: str) -> None:
        self.errors_total += 1
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(message)

    def add(self, row: Conversation | InputError) -> None:
        """One parsed row, or the one-line error that rejected it (a bad sample; the audit goes on)."""
        self.samples += 1
        if isinstance(row, Conversation):
            try:
                answer = row.require_answer()
            except InputError as error:
                row = error
        if isinstance(row, InputError):
            self.bad += 1
            self.error(str(row))
            return
        answer_index = row.answer_index()
        prompt = [{"role": m["role"], "content": m["content"]} for m in row.messages[:answer_index]]
        reasoning, content = answer.get("reasoning_content"), answer["content"]
        unclosed = row.unclosed_think and answer_index == len(row.messages) - 1
        sample = row.id
        raw = row.fields
        self.ids.append(sample)

        # A final turn of only tool calls is an answer: the model's output is the calls.
        empty = not content.strip() and not answer.get("tool_calls")
        self.empty.append(empty)
        if empty:
            self.checks["empty_response"].add(1, [sample])
        if reasoning is None:
            self.checks["no_thinking"].add(1, [sample])
        elif not reasoning.strip():
            self.checks["empty_thinking"].add(1, [sample])
        if unclosed:
            self.checks["unclosed_thinking"].add(1, [sample])

        finish = raw.get("finish_reason")
        if finish is not None:
            self.any_finish_reason = True
            finish = str(finish)
            if finish == "length":
                self.checks["truncated"].add(1, [sample])
            elif finish not in NORMAL_STOPS:
                self.checks["missing_end_of_turn"].add(1, [sample])
        if unclosed and finish != "length":
            self.checks["missing_end_of_turn"].add(1, [sample])

        completion_text = ("<think>\n" + reasoning + "\n</think>\n\n" if reasoning else "") + content
        completion_tokens = _int_or_none(raw.get("completion_tokens"))
        prompt_tokens = _int_or_none(raw.get("prompt_tokens"))
        completion_ids, prompt_ids = raw.get("completion_token_ids"), raw.get("prompt_token_ids")
        if completion_tokens is None and isinstance(completion_ids, list):
            completion_tokens = len(completion_ids)
        if prompt_tokens is None and isinstance(prompt_ids, list):
            prompt_tokens = len(prompt_ids)
        position = len(self.ids) - 1
        self.token_lengths.append(-1 if completion_tokens is None else completion_tokens)
        self.prompt_lengths.append(-1 if prompt_tokens is None else prompt_tokens)
        self.char_lengths.append(len(completion_text))
        if self.info is not None and (completion_tokens is None or prompt_tokens is None):
            # Counted in batches: one tokenizer call per few thousand rows, not one per row.
            self.pending.append((
                position,
                completion_text if completion_tokens is None else None,
                prompt if prompt_tokens is None else None,
                row.tools,  # the prompt the model saw had them
            ))
            if len(self.pending) >= PENDING:
                self._count_pending()

        completion_hash = _digest([reasoning or "", content, answer.get("tool_calls") or []])
        self.completion_hashes.append(completion_hash)
        self.prompt_hashes.append(_digest(prompt))
        if not empty:
            self.chunk_hashes.append(completion_hash)
            self.chunk_texts.setdefault(completion_hash, completion_text)
        if len(self.chunk_hashes) >= CHUNK:
            self._flush_chunk()

    def _count_pending(self) -> None:
        tokenizer = self.info.tokenizer
        completions = [(position, text) for position, text, _, _ in self.pending if text is not None]
        prompts = []
        for position, _, prompt, tools in self.pending:
            if prompt is None:
                continue
            try:
                extra = {"tools": tools} if tools else {}
                text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True, **extra)
                prompts.append((position, text))
            except Exception:  # a prompt the template rejects still gets the other checks
                continue
        for target, items in ((self.token_lengths, completions), (self.prompt_lengths, prompts)):
            if items:
                encoded = tokenizer([text for _, text in items], add_special_tokens=False)["input_ids"]
                for (position, _), ids in zip(items, encoded):
                    target[position] = len(ids)
        self.pending = []

    def _flush_chunk(self) -> None:
        # Keep texts only for each chunk's most common completions: a completion holding share s
        # of the data holds >= s of some chunk, so it is among that chunk's top 1/s.
        if self.chunk_hashes:
            unique, counts = np.unique(np.asarray(self.chunk_hashes, dtype=np.uint64), return_counts=True)
            for pick in np.argsort(-counts, kind="stable")[:TOP_PER_CHUNK]:
                key = int(unique[pick])
                self.texts.setdefault(key, self.chunk_texts[key])
        self.chunk_hashes, self.chunk_texts = [], {}

    def finish(self, paths, thresholds: Thresholds, settings: dict[str, Any]) -> AuditReport:
        self._flush_chunk()
        if self.pending:
            self._count_pending()
        ids = self.ids
        tokens = np.asarray(self.token_lengths, dtype=np.int64)
        known_tokens = len(tokens) > 0 and bool((tokens >= 0).all())
        lengths = tokens if known_tokens else np.asarray(self.char_lengths, dtype=np.int64)
        unit = "tokens" if known_tokens else "chars"
        trainable_counts = np.bincount(lengths) if len(lengths) else np.zeros(1, dtype=np.int64)
        prompt_tokens = np.asarray(self.prompt_lengths, dtype=np.int64)
        totals = np.where((tokens >= 0) & (prompt_tokens >= 0), tokens + prompt_tokens, -1)
        sequence_counts = np.bincount(totals) if len(totals) and (totals >= 0).all() else None
        if self.max_context is not None:
            over = totals > self.max_context
            self.checks["over_context"].add(int(over.sum()), [ids[i] for i in np.flatnonzero(over)[:EXAMPLES]])
        pick_ids = lambda where: [ids[i] for i in np.flatnonzero(where)[:EXAMPLES]]  # noqa: E731

        mask_sum = Dominant()
        if len(lengths):
            order = np.argsort(-trainable_counts, kind="stable")[:5]
            mask_sum.value = int(order[0])
            mask_sum.count = int(trainable_counts[order[0]])
            mask_sum.example_ids = pick_ids(lengths == mask_sum.value)
            mask_sum.top = [{"value": int(v), "count": int(trainable_counts[v])} for v in order if trainable_counts[v]]

        span = Dominant()
        completions = np.asarray(self.completion_hashes, dtype=np.uint64)
        nonempty = ~np.asarray(self.empty, dtype=bool)
        if nonempty.any():
            positions = np.flatnonzero(nonempty)
            unique, first, counts = np.unique(completions[nonempty], return_index=True, return_counts=True)
            for rank, pick in enumerate(np.argsort(-counts, kind="stable")[:5]):
                key = int(unique[pick])
                entry = {
                    "count": int(counts[pick]),
                    "num_tokens": int(lengths[positions[first[pick]]]) if known_tokens else None,
                    "text": self.texts.get(key),
                    "example_ids": pick_ids(nonempty & (completions == unique[pick])),
                }
                span.top.append(entry)
                if rank == 0:
                    span.count, span.num_tokens = entry["count"], entry["num_tokens"]
                    span.text, span.example_ids = entry["text"], entry["example_ids"]
            duplicate = np.ones(len(positions), dtype=bool)
            duplicate[first] = False
            self.checks["duplicate_completions"].add(
                int(duplicate.sum()), [ids[i] for i in positions[duplicate][:EXAMPLES]]
            )
        duplicate = duplicate_prompts(self.prompt_hashes, completions)
        self.checks["duplicate_prompts"].add(int(duplicate.sum()), pick_ids(duplicate))
        if ids:
            _, first = np.unique(np.asarray(ids, dtype=object).astype(str), return_index=True)
            repeated = np.ones(len(ids), dtype=bool)
            repeated[first] = False
            self.checks["repeated_ids"].add(int(repeated.sum()), pick_ids(repeated))

        self.checks["missing_end_of_turn"].checked = self.any_finish_reason or self.checks["unclosed_thinking"].count > 0
        if not self.checks["missing_end_of_turn"].checked:
            self.checks["missing_end_of_turn"].note = "rows carry no finish_reason"
        self.checks["truncated"].checked = self.any_finish_reason
        if not self.any_finish_reason:
            self.checks["truncated"].note = "rows carry no finish_reason"
        over = self.checks["over_context"]
        over.checked = self.max_context is not None and bool((totals >= 0).any())
        if not over.checked:
            over.note = "needs --max-context and token counts (usage fields or --tokenizer)"
        return AuditReport.from_tally(
            self, paths, input_kind="conversations", length_unit=unit, trainable_counts=trainable_counts,
            sequence_counts=sequence_counts, dominant_mask_sum=mask_sum, dominant_span=span, thresholds=thresholds,
            settings=settings,
        )


def audit_conversations(
    paths: str | Path | list[str | Path],
    thresholds: Thresholds | dict | None = None,
    *,
    tokenizer: Any = None,
    max_context: int | None = None,
    progress: Callable[[int, int | None], None] | None = None,
    split: str | None = None,
) -> AuditReport:
    """Audit conversation rows (any source and row format `draftsmith.data` reads).

    Completion lengths come from the rows' usage fields (`completion_tokens`,
    `completion_token_ids`), or from `tokenizer` when given, else are counted in characters.
    """
    paths = [paths] if isinstance(paths, (str, Path)) else list(paths)
    limits = coerce_thresholds(thresholds)
    info = load_tokenizer(tokenizer) if tokenizer is not None else None
    if max_context is None and info is not None:
        max_context = info.model_max_length
    accumulator = _ConversationAccumulator(info, max_context)
    for record in iter_records(resolve(paths, split)):
        try:
            row: Conversation | InputError = parse_conversation(record)
        except InputError as error:
            row = error
        accumulator.add(row)
        if progress and accumulator.samples % 10000 == 0:
            progress(accumulator.samples, None)
    settings = {"tokenizer": info.name if info else None, "max_context": max_context}
    return accumulator.finish(paths, limits, settings)
