"""Audit a tokenized dataset (contract 2) in a single streaming pass.

Every check runs on whole record batches: the flat `values` buffers of the `input_ids` and
`loss_mask` list arrays plus their offsets, with numpy cumulative sums standing in for per-row
loops. Per-row results (trainable-token counts, span hashes) are kept as small numpy arrays so
dominant values and duplicates are exact over the whole dataset.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from draftsmith.data.sources import count_records
from draftsmith.data.tokenized import iter_tokenized_batches, tokenized_files
from draftsmith.audit.report import EXAMPLES, AuditReport, Check, Dominant, duplicate_prompts
from draftsmith.audit.thresholds import Thresholds, coerce_thresholds
from draftsmith.audit.tokens import TokenizerInfo, load_tokenizer
from draftsmith.core.errors import InputError

MAX_ERRORS = 50
#: span candidates kept per batch: a span holding share s of the dataset holds >= s of some batch,
#: so it is among that batch's top 1/s spans; 32 covers every span above ~3%.
TOP_PER_BATCH = 32
MAX_REPRESENTATIVES = 4096
STORED_SPAN_TOKENS = 512

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_BASE = 0x100000001B3  # odd, hence invertible modulo 2**64
_BASE_INVERSE = pow(_BASE, -1, 2**64)
_MIXED_TABLE_LIMIT = 1 << 22  # larger token ids are mixed directly instead of via the table

# Token classes, one uint8 lookup per token instead of one pass per question.
END_OF_TURN, TRIVIAL, SCAFFOLDING, THINK_OPEN, THINK_CLOSE, HEADER_START = 1, 2, 4, 8, 16, 32


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: spreads token ids so the polynomial hash has no easy collisions."""
    x = (x.astype(np.uint64) + _GOLDEN) * _MIX1
    x ^= x >> np.uint64(31)
    x *= _MIX2
    x ^= x >> np.uint64(29)
    return x


def _powers(base: int, size: int) -> np.ndarray:
    """base**k mod 2**64 for k < size: an outer product of two short tables (uint64 wraps)."""
    block = 1024

    def accumulate(step: int, count: int) -> np.ndarray:
        table = np.full(count, np.uint64(step), dtype=np.uint64)
        table[0] = 1
        return np.multiply.accumulate(table)

    low = accumulate(base, block)
    high = accumulate(pow(base, block, 2**64), -(-size // block))
    return np.multiply.outer(high, low).ravel()[:size]


class _RowHasher:
    """Order-sensitive 64-bit polynomial hash of selected tokens per row, with no per-token rank.

    Token j of the batch's selected tokens contributes mix(id) * B**j; a row's hash is its slice
    sum times B**-start, which equals sum(mix(id) * B**rank_in_row). One gather, one multiply and
    one cumulative sum per token.
    """

    def __init__(self) -> None:
        self.mixed = _mix(np.arange(1 << 16, dtype=np.uint64))
        self.power = _powers(_BASE, 1 << 16)
        self.inverse = _powers(_BASE_INVERSE, 1 << 16)

    def _mixed(self, chosen: np.ndarray, top: int) -> np.ndarray:
        if top >= len(self.mixed) and top < _MIXED_TABLE_LIMIT:
            self.mixed = _mix(np.arange(min(2 * (top + 1), _MIXED_TABLE_LIMIT), dtype=np.uint64))
        if top < len(self.mixed):
            return self.mixed[chosen]
        return _mix(chosen)

    def rows(self, chosen: np.ndarray, starts: np.ndarray, ends: np.ndarray, top: int) -> np.ndarray:
        size = len(chosen) + 1
        if size > len(self.power):
            self.power = _powers(_BASE, 2 * size)
            self.inverse = _powers(_BASE_INVERSE, 2 * size)
        contributions = self._mixed(chosen, top)
        contributions *= self.power[: len(chosen)]
        running = np.zeros(size, dtype=np.uint64)
        np.cumsum(contributions, out=running[1:])
        hashes = (running[ends] - running[starts]) * self.inverse[starts]
        counts = (ends - starts).astype(np.uint64)
        return _mix(hashes ^ (counts * _MIX2))


def _prefix_count(flags: np.ndarray) -> np.ndarray:
    """[0, running count of True]: segment counts are differences at the row offsets.

    The int64 cast first matters: numpy's cumsum from bool is ~10x slower than from int64.
    """
    cumulative = np.zeros(len(flags) + 1, dtype=np.int64)
    np.cumsum(flags.astype(np.int64), out=cumulative[1:])
    return cumulative


def _rows_of(positions: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Row index of each (sorted or not) flat token position."""
    return np.searchsorted(offsets, positions, side="right") - 1


def token_classes(info: TokenizerInfo) -> np.ndarray:
    classes = np.zeros(info.vocab_size, dtype=np.uint8)
    classes[info.end_of_turn_ids[info.end_of_turn_ids < info.vocab_size]] |= END_OF_TURN
    classes[info.trivial] |= TRIVIAL
    classes[info.scaffolding] |= SCAFFOLDING
    if info.think_open is not None:
        classes[info.think_open] |= THINK_OPEN
    if info.think_close is not None:
        classes[info.think_close] |= THINK_CLOSE
    if len(info.assistant_header):
        classes[int(info.assistant_header[0])] |= HEADER_START
    return classes


def _to_numpy(array: pa.Array) -> np.ndarray:
    return array.to_numpy(zero_copy_only=False)


def _lengths(column: pa.Array) -> np.ndarray:
    return _to_numpy(pc.fill_null(pc.list_value_length(column), -1)).astype(np.int64)


def _offsets(lengths: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def _example_ids(batch_ids: pa.Array | None, rows: np.ndarray, global_rows: np.ndarray | int) -> list[str]:
    """Ids of `rows` (positions in `batch_ids`); `#N` (global row N) when there is no id column."""
    rows = np.asarray(rows)[:EXAMPLES]
    if batch_ids is None:
        if isinstance(global_rows, (int, np.integer)):
            return [f"#{global_rows + int(r)}" for r in rows]
        return [f"#{int(global_rows[r])}" for r in rows]
    return [str(v) for v in batch_ids.take(pa.array(rows, type=pa.int64())).to_pylist()]


@dataclass
class _Rows:
    """One batch's readable rows, flat: token ids, the trained mask, per-row lengths and offsets;
    `_count_rows` adds the per-row trained sums and positions the later checks share."""

    batch: pa.RecordBatch
    ids: pa.Array | None
    global_rows: np.ndarray
    values: np.ndarray
    mask: np.ndarray  # bool
    lengths: np.ndarray
    offsets: np.ndarray
    top: int
    cumulative_mask: np.ndarray | None = None
    trained_start: np.ndarray | None = None
    trained_end: np.ndarray | None = None
    sums: np.ndarray | None = None
    trained: np.ndarray | None = None
    first_masked: np.ndarray | None = None

    @property
    def n(self) -> int:
        return len(self.lengths)

    def examples(self, flags: np.ndarray) -> list[str]:
        return _example_ids(self.ids, np.flatnonzero(flags), self.global_rows)


class _Accumulator:
    def __init__(self, tokenizer: TokenizerInfo | None, max_context: int | None):
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.hasher = _RowHasher()
        self.classes = token_classes(tokenizer) if tokenizer is not None else None
        self.samples = 0
        self.bad = 0
        self.errors: list[str] = []
        self.errors_total = 0
        self.trainable_counts = np.zeros(1, dtype=np.int64)
        self.sequence_counts = np.zeros(1, dtype=np.int64)
        self.ids: list[pa.Array | None] = []
        self.id_offsets: list[int] = []
        self.good_index: list[np.ndarray] = []  # global row index of each audited row
        self.sums: list[np.ndarray] = []
        self.span_hashes: list[np.ndarray] = []
        self.prompt_hashes: list[np.ndarray] = []
        self.representatives: dict[int, list[int]] = {}
        self.span_lengths: dict[int, int] = {}
        has_tokenizer = tokenizer is not None
        header = has_tokenizer and len(tokenizer.assistant_header) > 0
        self.checks = {
            "empty_response": Check("empty_response"),
            "empty_thinking": Check("empty_thinking", checked=has_tokenizer and tokenizer.think_open is not None),
            "missing_end_of_turn": Check("missing_end_of_turn", checked=has_tokenizer),
            "truncated": Check("truncated", checked=False),
            "over_context": Check("over_context", checked=max_context is not None),
            "scaffolding_masked": Check("scaffolding_masked", checked=has_tokenizer),
            "prompt_masked": Check("prompt_masked"),
            "length_mismatch": Check("length_mismatch"),
            "duplicate_completions": Check("duplicate_completions"),
            "duplicate_prompts": Check("duplicate_prompts"),
            "repeated_ids": Check("repeated_ids"),
            "no_thinking": Check("no_thinking", checked=has_tokenizer and tokenizer.think_open is not None),
            "unclosed_thinking": Check("unclosed_thinking", checked=has_tokenizer and tokenizer.think_open is not None),
            "trainable_count_mismatch": Check("trainable_count_mismatch"),
        }
        if not has_tokenizer:
            note = "needs --tokenizer"
            for name in ("empty_thinking", "missing_end_of_turn", "scaffolding_masked", "no_thinking", "unclosed_thinking"):
                self.checks[name].note = note
            self.checks["prompt_masked"].note = "without --tokenizer only a masked first token is detected"
            self.checks["empty_response"].note = "without --tokenizer only samples with no trainable tokens"
        elif not header:
            self.checks["prompt_masked"].note = "no assistant header found in the chat template; first token only"
        if max_context is None:
            self.checks["over_context"].note = "needs --max-context (or a tokenizer with model_max_length)"

    # -- helpers -------------------------------------------------------------------------------
    def error(self, message: str) -> None:
        self.errors_total += 1
        if len(self.errors) < MAX_ERRORS:
            self.errors.append(message)

    def _ids(self, batch_ids: pa.Array | None, rows: np.ndarray, global_rows: np.ndarray | int) -> list[str]:
        return _example_ids(batch_ids, rows, global_rows)

    def _add_counts(self, which: str, counts: np.ndarray) -> None:
        current = getattr(self, which)
        if len(counts) > len(current):
            current = np.concatenate([current, np.zeros(len(counts) - len(current), dtype=np.int64)])
        current[: len(counts)] += counts
        setattr(self, which, current)

    # -- one batch -----------------------------------------------------------------------------
    def add_batch(self, file: Path, file_row: int, batch: pa.RecordBatch) -> None:
        base = self.samples
        self.samples += batch.num_rows
        batch_ids = batch.column("id").cast(pa.string()) if "id" in batch.schema.names else None
        self.ids.append(batch_ids)
        self.id_offsets.append(base)
        batch, batch_ids, good_rows, lengths = self._drop_unreadable_rows(file, file_row, batch, batch_ids, base)
        values, raw_mask, null_tokens = self._flat_values(file, batch)
        offsets = _offsets(lengths)
        keep_rows = self._invalid_value_rows(file, file_row, (values, raw_mask, null_tokens), offsets, batch_ids, base, good_rows)
        if keep_rows is not None:
            token_keep = np.repeat(keep_rows, lengths)
            values, raw_mask = values[token_keep], raw_mask[token_keep]
            lengths, good_rows = lengths[keep_rows], good_rows[keep_rows]
            batch = batch.filter(pa.array(keep_rows))
            batch_ids = batch_ids.filter(pa.array(keep_rows)) if batch_ids is not None else None
            offsets = _offsets(lengths)
        if raw_mask.dtype == np.bool_:
            mask = raw_mask
        elif raw_mask.dtype.itemsize == 1:
            mask = raw_mask.view(np.bool_)  # validated 0/1 above: a free reinterpretation
        else:
            mask = raw_mask != 0
        if len(lengths):
            top = int(values.max()) if len(values) else 0
            self._audit_rows(_Rows(batch, batch_ids, base + good_rows, values, mask, lengths, offsets, top))

    def _drop_unreadable_rows(self, file, file_row, batch, batch_ids, base):
        """Rows with a null column or columns of different lengths are counted, reported and
        dropped; returns the rest: (batch, ids, their positions in the batch, their lengths)."""
        input_ids, loss_mask = batch.column("input_ids"), batch.column("loss_mask")
        id_lengths, mask_lengths = _lengths(input_ids), _lengths(loss_mask)
        null_rows = (id_lengths < 0) | (mask_lengths < 0)
        mismatch = ~null_rows & (id_lengths != mask_lengths)
        good = ~(null_rows | mismatch)
        if null_rows.any():
            where = np.flatnonzero(null_rows)
            self.bad += len(where)
            for r, sample in zip(where[:3], self._ids(batch_ids, where[:3], base)):
                self.error(f"{file}: row {file_row + int(r)} (id {sample}): input_ids or loss_mask is null")
            self.errors_total += max(0, len(where) - 3)
        if mismatch.any():
            where = np.flatnonzero(mismatch)
            self.checks["length_mismatch"].add(len(where), self._ids(batch_ids, where, base))
            for r, sample in zip(where[:3], self._ids(batch_ids, where[:3], base)):
                self.error(
                    f"{file}: row {file_row + int(r)} (id {sample}): "
                    f"input_ids has {id_lengths[r]} tokens but loss_mask has {mask_lengths[r]}"
                )
            self.errors_total += max(0, len(where) - 3)
        if not good.all():
            keep = pa.array(good)
            batch = batch.filter(keep)
            batch_ids = batch_ids.filter(keep) if batch_ids is not None else None
        return batch, batch_ids, np.flatnonzero(good), id_lengths[good]

    def _flat_values(self, file, batch) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
        """The flat token ids and raw mask values of the batch, and where either held a null
        (filled with 0; `_invalid_value_rows` reports those rows)."""
        input_ids, loss_mask = batch.column("input_ids"), batch.column("loss_mask")
        flat_ids, flat_mask = pc.list_flatten(input_ids), pc.list_flatten(loss_mask)
        if not (pa.types.is_integer(flat_ids.type) and (pa.types.is_integer(flat_mask.type) or pa.types.is_boolean(flat_mask.type))):
            raise InputError(
                f"{file}: input_ids must be a list of integers and loss_mask a list of integers or "
                f"booleans, not {input_ids.type} / {loss_mask.type}"
            )
        null_tokens = None
        if flat_ids.null_count or flat_mask.null_count:
            null_tokens = _to_numpy(pc.or_(pc.is_null(flat_ids), pc.is_null(flat_mask)))
            flat_ids, flat_mask = pc.fill_null(flat_ids, 0), pc.fill_null(flat_mask, 0)
        return _to_numpy(flat_ids), _to_numpy(flat_mask), null_tokens

    def _invalid_value_rows(self, file, file_row, flat, offsets, batch_ids, base, good_rows) -> np.ndarray | None:
        """Rows whose values cannot be trusted are unreadable: null tokens, mask values other than
        0/1, token ids outside the vocabulary. Counted and reported; returns the rows to keep, or
        None when all are fine. Cheap reductions first; per-token flags only when something is off."""
        values, raw_mask, null_tokens = flat
        top = int(values.max()) if len(values) else 0
        bottom = int(values.min()) if len(values) else 0
        vocab = self.tokenizer.vocab_size if self.tokenizer is not None else None
        if raw_mask.dtype == np.bool_:
            mask_ok = True
        elif raw_mask.dtype.itemsize == 1:
            mask_ok = not len(raw_mask) or int(raw_mask.view(np.uint8).max()) <= 1
        else:
            mask_ok = not len(raw_mask) or (int(raw_mask.max()) <= 1 and int(raw_mask.min()) >= 0)
        if mask_ok and bottom >= 0 and (vocab is None or top < vocab) and null_tokens is None:
            return None
        problems = {
            "null tokens": null_tokens,
            "token ids out of range" + (f" (vocabulary size {vocab})" if vocab is not None else " (negative)"): (
                (values < 0) if vocab is None else ((values < 0) | (values >= vocab))
            ),
            "loss_mask values other than 0/1": None if raw_mask.dtype == np.bool_ else (raw_mask != 0) & (raw_mask != 1),
        }
        row_problems = {}
        for problem, flags in problems.items():
            if flags is not None and flags.any():
                counts = _prefix_count(flags)
                row_problems[problem] = (counts[offsets[1:]] - counts[offsets[:-1]]) > 0
        bad_rows = np.logical_or.reduce(list(row_problems.values()))
        where = np.flatnonzero(bad_rows)
        self.bad += len(where)
        for r, sample in zip(where[:3], self._ids(batch_ids, where[:3], base + good_rows)):
            reasons = ", ".join(problem for problem, rows_flag in row_problems.items() if rows_flag[r])
            self.error(f"{file}: row {file_row + int(good_rows[r])} (id {sample}): {reasons}")
        self.errors_total += max(0, len(where) - 3)
        return ~bad_rows

    def _audit_rows(self, rows: _Rows) -> None:
        self._count_rows(rows)
        if self.tokenizer is None:
            empty = rows.sums == 0
            self.checks["empty_response"].add(int(empty.sum()), rows.examples(empty))
            self.checks["prompt_masked"].add(int(rows.first_masked.sum()), rows.examples(rows.first_masked))
            return
        self._template_checks(rows)

    def _count_rows(self, rows: _Rows) -> None:
        """Per-row sums and span/prompt hashes for the whole-dataset questions, and the checks that
        need no tokenizer: stated counts, truncation, context length."""
        values, mask, lengths, offsets, n = rows.values, rows.mask, rows.lengths, rows.offsets, rows.n
        rows.cumulative_mask = cumulative_mask = _prefix_count(mask)
        rows.trained_start, rows.trained_end = cumulative_mask[offsets[:-1]], cumulative_mask[offsets[1:]]
        rows.sums = sums = rows.trained_end - rows.trained_start
        rows.trained = values[mask]
        span_hashes = self.hasher.rows(rows.trained, rows.trained_start, rows.trained_end, rows.top)
        # Untrained tokens: their running index is position minus trained tokens before it.
        prompt_hashes = self.hasher.rows(
            values[~mask], offsets[:-1] - rows.trained_start, offsets[1:] - rows.trained_end, rows.top
        )
        self._add_counts("trainable_counts", np.bincount(sums))
        self._add_counts("sequence_counts", np.bincount(lengths))
        self.good_index.append(rows.global_rows)
        self.sums.append(sums.astype(np.int32))
        self.span_hashes.append(span_hashes)
        self.prompt_hashes.append(prompt_hashes)
        self._keep_representatives(span_hashes, sums, rows.trained, rows.trained_start)

        names = rows.batch.schema.names
        if "num_trainable" in names or "num_tokens" in names:
            disagree = np.zeros(n, dtype=bool)
            for column, actual in (("num_trainable", sums), ("num_tokens", lengths)):
                if column in names:
                    stated = _to_numpy(pc.fill_null(rows.batch.column(column), -1)).astype(np.int64)
                    disagree |= stated != actual
            self.checks["trainable_count_mismatch"].add(int(disagree.sum()), rows.examples(disagree))
        if "finish_reason" in names:
            self.checks["truncated"].checked = True
            truncated = _to_numpy(pc.fill_null(pc.equal(rows.batch.column("finish_reason"), "length"), False))
            self.checks["truncated"].add(int(truncated.sum()), rows.examples(truncated))
        if self.max_context is not None:
            over = lengths > self.max_context
            self.checks["over_context"].add(int(over.sum()), rows.examples(over))
        nonempty_rows = lengths > 0
        rows.first_masked = np.zeros(n, dtype=bool)
        rows.first_masked[nonempty_rows] = mask[offsets[:-1][nonempty_rows]]

    def _template_checks(self, rows: _Rows) -> None:
        """The checks that need token meaning: empty response, end of turn, scaffolding and prompt
        tokens trained on, thinking."""
        values, mask, offsets, n, sums = rows.values, rows.mask, rows.offsets, rows.n, rows.sums
        examples = rows.examples
        # One dense gather and one dense nonzero; every question below works on the (few) tokens
        # that have a class at all: whitespace, special tokens, think delimiters, header starts.
        classes = self.classes[values]
        marked = np.flatnonzero(classes)
        marked_classes = classes[marked]
        marked_trained = mask[marked]

        def where(bit: int, trained_only: bool = False) -> np.ndarray:
            selected = (marked_classes & bit) != 0
            return marked[selected & marked_trained] if trained_only else marked[selected]

        per_row = lambda positions: np.bincount(_rows_of(positions, offsets), minlength=n)  # noqa: E731

        # Empty response: every trained token is whitespace, special or a think delimiter.
        empty = per_row(where(TRIVIAL, trained_only=True)) == sums
        self.checks["empty_response"].add(int(empty.sum()), examples(empty))

        # The last trained token must end the turn, or the drafter never learns to stop.
        has_trained = sums > 0
        missing = np.zeros(n, dtype=bool)
        last_trained = rows.trained[rows.trained_end[has_trained] - 1]
        missing[has_trained] = (self.classes[last_trained] & END_OF_TURN) == 0
        self.checks["missing_end_of_turn"].add(int(missing.sum()), examples(missing))

        header_starts, header_rows, header_trained = self._assistant_headers(where, values, mask, offsets)
        scaffolding_rows = per_row(where(SCAFFOLDING, trained_only=True)) > 0
        scaffolding_rows[header_rows[header_trained > 0]] = True
        self.checks["scaffolding_masked"].add(int(scaffolding_rows.sum()), examples(scaffolding_rows))

        prompt_rows = rows.first_masked.copy()
        if len(header_starts):
            prompt_rows |= self._prompt_trained(rows, where(END_OF_TURN), header_starts, header_rows, header_trained)
        self.checks["prompt_masked"].add(int(prompt_rows.sum()), examples(prompt_rows))

        if self.tokenizer.think_open is not None:
            self._thinking(where, offsets, n, examples)

    def _assistant_headers(self, where, values, mask, offsets):
        """Occurrences of the full assistant header, found from its first token: (starts, their
        rows, how many of their tokens are trained)."""
        header = self.tokenizer.assistant_header
        header_starts = np.zeros(0, dtype=np.int64)
        if len(header):
            candidates = where(HEADER_START)
            row_ends = offsets[_rows_of(candidates, offsets) + 1]
            matched = candidates + len(header) <= row_ends
            for index in range(1, len(header)):
                at = np.minimum(candidates + index, len(values) - 1)
                matched &= values[at] == header[index]
            header_starts = candidates[matched]
        header_trained = np.zeros(len(header_starts), dtype=np.int64)
        for index in range(len(header)):
            header_trained += mask[header_starts + index]
        return header_starts, _rows_of(header_starts, offsets), header_trained

    def _prompt_trained(self, rows: _Rows, ends_of_turn, header_starts, header_rows, header_trained) -> np.ndarray:
        """Rows with an assistant header that train tokens outside every assistant turn (header
        end up to and including the next end-of-turn)."""
        header = self.tokenizer.assistant_header
        offsets, n = rows.offsets, rows.n
        turn_starts = header_starts + len(header)
        row_ends = offsets[header_rows + 1]
        next_end = np.searchsorted(ends_of_turn, turn_starts)
        turn_ends = np.where(  # exclusive
            next_end < len(ends_of_turn),
            ends_of_turn[np.minimum(next_end, max(len(ends_of_turn) - 1, 0))] + 1 if len(ends_of_turn) else 0,
            row_ends,
        )
        next_header = np.r_[header_starts[1:], np.iinfo(np.int64).max]
        turn_ends = np.minimum(np.minimum(turn_ends, row_ends), next_header)
        turn_ends = np.maximum(turn_ends, turn_starts)
        inside = rows.cumulative_mask[turn_ends] - rows.cumulative_mask[turn_starts]
        inside_per_row = np.bincount(header_rows, weights=inside + header_trained, minlength=n)
        has_header = np.zeros(n, dtype=bool)
        has_header[header_rows] = True
        return has_header & (rows.sums - inside_per_row.astype(np.int64) > 0)

    def _thinking(self, where, offsets, n, examples) -> None:
        # Only blocks the row trains on are the model's: a template's untrained empty block (thinking
        # switched off, or inserted before an answer without reasoning) is no thinking, as in the
        # conversation audit, never `empty_thinking`.
        opens = where(THINK_OPEN, trained_only=True)
        open_rows = _rows_of(opens, offsets)
        has_open = np.zeros(n, dtype=bool)
        has_open[open_rows] = True
        no_thinking = ~has_open
        self.checks["no_thinking"].add(int(no_thinking.sum()), examples(no_thinking))
        if not len(opens):
            return
        # The template keeps thinking only on the final assistant turn: audit each row's last block.
        last = np.r_[open_rows[1:] != open_rows[:-1], True]
        last_opens, last_rows = opens[last], open_rows[last]
        closes = where(THINK_CLOSE)
        index = np.searchsorted(closes, last_opens)
        if len(closes):
            close_at = closes[np.minimum(index, len(closes) - 1)]
            closed = (index < len(closes)) & (close_at < offsets[last_rows + 1])
        else:
            close_at = last_opens
            closed = np.zeros(len(last_opens), dtype=bool)
        # Empty = every token strictly between the delimiters is trivial (whitespace).
        trivial = where(TRIVIAL)
        trivial_inside = np.searchsorted(trivial, close_at) - np.searchsorted(trivial, last_opens + 1)
        empty = closed & (trivial_inside == close_at - last_opens - 1)
        empty_rows = np.zeros(n, dtype=bool)
        empty_rows[last_rows[empty]] = True
        unclosed_rows = np.zeros(n, dtype=bool)
        unclosed_rows[last_rows[~closed]] = True
        self.checks["empty_thinking"].add(int(empty_rows.sum()), examples(empty_rows))
        self.checks["unclosed_thinking"].add(int(unclosed_rows.sum()), examples(unclosed_rows))

    def _keep_representatives(self, hashes, sums, trained, trained_start) -> None:
        nonempty = np.flatnonzero(sums > 0)
        if not len(nonempty):
            return
        unique, first, counts = np.unique(hashes[nonempty], return_index=True, return_counts=True)
        for pick in np.argsort(-counts, kind="stable")[:TOP_PER_BATCH]:
            key = int(unique[pick])
            if key in self.representatives:
                continue
            row = nonempty[first[pick]]
            start = trained_start[row]
            tokens = trained[start : start + sums[row]]
            self.representatives[key] = tokens[:STORED_SPAN_TOKENS].copy()
            self.span_lengths[key] = len(tokens)
        if len(self.representatives) > MAX_REPRESENTATIVES:
            self._prune_representatives()

    def _prune_representatives(self) -> None:
        """Keep the spans most common so far; a rare one cannot become dominant unnoticed, since
        a dominant span re-enters through the per-batch top list of the batches it fills."""
        seen, counts = np.unique(np.concatenate(self.span_hashes), return_counts=True)
        keys = np.fromiter(self.representatives, dtype=np.uint64, count=len(self.representatives))
        index = np.minimum(np.searchsorted(seen, keys), len(seen) - 1)
        key_counts = np.where(seen[index] == keys, counts[index], 0)
        keep = set(keys[np.argsort(-key_counts, kind="stable")[: MAX_REPRESENTATIVES // 4]].tolist())
        self.representatives = {k: v for k, v in self.representatives.items() if k in keep}
        self.span_lengths = {k: v for k, v in self.span_lengths.items() if k in keep}

    # -- whole dataset -------------------------------------------------------------------------
    def ids_of(self, global_rows: np.ndarray) -> list[str]:
        out = []
        for row in global_rows[:EXAMPLES]:
            chunk = int(np.searchsorted(self.id_offsets, row, side="right") - 1)
            local = int(row - self.id_offsets[chunk])
            ids = self.ids[chunk]
            out.append(f"#{row}" if ids is None else str(ids[local].as_py()))
        return out

    def _repeated_ids(self) -> None:
        chunks = [ids for ids in self.ids if ids is not None]
        check = self.checks["repeated_ids"]
        if not chunks:
            check.checked, check.note = False, "no id column"
            return
        every = pa.chunked_array(chunks, type=pa.string()).combine_chunks()
        counts = pc.value_counts(every)
        repeated = counts.filter(pc.greater(counts.field("counts"), 1))
        extra = int(pc.sum(pc.subtract(repeated.field("counts"), 1)).as_py() or 0)
        check.add(extra, [str(value) for value in repeated.field("values").to_pylist()[:EXAMPLES]])

    def finish(self, paths, thresholds: Thresholds, settings: dict[str, Any]) -> AuditReport:
        concat = lambda parts, dtype: np.concatenate(parts) if parts else np.zeros(0, dtype)  # noqa: E731
        rows = concat(self.good_index, np.int64)
        sums = concat(self.sums, np.int32)
        spans = concat(self.span_hashes, np.uint64)
        prompts = concat(self.prompt_hashes, np.uint64)

        mask_sum = Dominant()
        if len(sums):
            top_values = np.argsort(-self.trainable_counts, kind="stable")[:5]
            mask_sum.value = int(top_values[0])
            mask_sum.count = int(self.trainable_counts[top_values[0]])
            mask_sum.example_ids = self.ids_of(rows[sums == mask_sum.value])
            mask_sum.top = [
                {"value": int(v), "count": int(self.trainable_counts[v])}
                for v in top_values
                if self.trainable_counts[v] > 0
            ]

        span = Dominant()
        nonempty = sums > 0
        duplicate_completions = self.checks["duplicate_completions"]
        if nonempty.any():
            unique, first, counts = np.unique(spans[nonempty], return_index=True, return_counts=True)
            order = np.argsort(-counts, kind="stable")[:5]
            nonempty_rows = rows[nonempty]
            for rank, pick in enumerate(order):
                key = int(unique[pick])
                tokens = self.representatives.get(key)
                entry = {
                    "count": int(counts[pick]),
                    "num_tokens": self.span_lengths.get(key, int(sums[nonempty][first[pick]])),
                    "example_ids": self.ids_of(nonempty_rows[spans[nonempty] == unique[pick]]),
                }
                if tokens is not None:
                    tokens = tokens.tolist()
                    entry["token_ids"] = tokens[:64]
                    if self.tokenizer is not None:
                        entry["text"] = self.tokenizer.decode(tokens)
                span.top.append(entry)
                if rank == 0:
                    span.count = entry["count"]
                    span.num_tokens = entry["num_tokens"]
                    span.text = entry.get("text")
                    span.token_ids = entry.get("token_ids")
                    span.example_ids = entry["example_ids"]
            duplicate = np.ones(int(nonempty.sum()), dtype=bool)
            duplicate[first] = False
            duplicate_completions.add(int(duplicate.sum()), self.ids_of(nonempty_rows[duplicate]))
        duplicate = duplicate_prompts(prompts, spans)
        self.checks["duplicate_prompts"].add(int(duplicate.sum()), self.ids_of(rows[duplicate]))
        self._repeated_ids()

        return AuditReport.from_tally(
            self, paths, input_kind="tokenized", length_unit="tokens", trainable_counts=self.trainable_counts,
            sequence_counts=self.sequence_counts, dominant_mask_sum=mask_sum, dominant_span=span, thresholds=thresholds,
            settings=settings,
        )


def _total_rows(paths, split: str | None) -> int:
    return sum(count_records(tokenized_files(path, split)) for path in paths)


def audit_tokenized(
    path: str | Path | list[str | Path],
    tokenizer: Any = None,
    thresholds: Thresholds | dict | None = None,
    *,
    max_context: int | None = None,
    batch_size: int = 16384,
    progress: Callable[[int, int | None], None] | None = None,
    split: str | None = None,
) -> AuditReport:
    """Audit tokenized data (Parquet shards/file, Arrow files, `datasets.save_to_disk` dir).

    `tokenizer` (an object or a path) enables the checks that need token meaning: end-of-turn,
    role-header and prompt masking, empty thinking, decoded dominant spans. `max_context`
    defaults to the tokenizer's `model_max_length` when it has a real one.
    `progress(rows_done, rows_total_or_None)` is called after each batch.
    """
    paths = list(path) if isinstance(path, (list, tuple)) else [path]
    limits = coerce_thresholds(thresholds)
    info = load_tokenizer(tokenizer) if tokenizer is not None else None
    if max_context is None and info is not None:
        max_context = info.model_max_length
    accumulator = _Accumulator(info, max_context)
    total = _total_rows(paths, split) if progress else None
    for item in paths:
        current_file, file_row = None, 0
        for file, batch in iter_tokenized_batches(item, batch_size=batch_size, split=split):
            if file != current_file:
                current_file, file_row = file, 0
            accumulator.add_batch(file, file_row, batch)
            file_row += batch.num_rows
            if progress:
                progress(accumulator.samples, total)
    settings = {"tokenizer": info.name if info else None, "max_context": max_context}
    return accumulator.finish(paths, limits, settings)
