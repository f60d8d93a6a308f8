"""`tokenize_dataset`: stream conversations, build masked rows in parallel, write Parquet shards.

The main process reads raw rows and hands chunks to worker processes (each loads the tokenizer
once); at most a few chunks per worker are in flight, so memory stays flat however large the
input. Results come back in input order, so the shards do not depend on the worker count.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from draftsmith.core.config import cli
from draftsmith.core.errors import DraftsmithError, InputError
from draftsmith.core.manifest import MANIFEST_NAME, check_manifest, set_complete, tokenizer_fingerprint
from draftsmith.core.paths import require_output_dir
from draftsmith.core.io import write_json_atomic
from draftsmith.core.lock import lock_directory
from draftsmith.core.signals import ignore_interrupts_in_worker
from draftsmith.core.progress import Progress
from draftsmith.tokenize.masking import POLICY_REASONS, ChatMasker, MaskedRow, MaskerConfig, RowDropped
from draftsmith.data.conversation import parse_conversation
from draftsmith.data.generated import engine_fields
from draftsmith.data.sources import Record, count_records, iter_records, resolve
from draftsmith.data.tokenized import SUMMARY_NAME, ShardWriter, prepare_output_dir, written_ids

EXAMPLES_PER_REASON = 3
# A row this long is not a training sample but a mistake (a whole file pasted into a turn), and
# tokenizing it with offsets costs ~200x its size in memory: 50 MB took 10 GB.
DEFAULT_MAX_ROW_BYTES = 16 * 1024 * 1024
# Give up early when a template cannot mask anything: no point tokenizing a million rows to drop them.
FAIL_FAST_ROWS = 256


class TokenizeError(DraftsmithError):
    """Too many rows could not be masked correctly (or none was written); `summary` says why."""

    def __init__(self, message: str, summary: TokenizeSummary | None = None):
        super().__init__(message)
        self.summary = summary


class TokenizeOptions(BaseModel):
    """How to tokenize; every field has a CLI flag of the same name."""

    train_turns: Literal["final", "all"] = Field("final", description="assistant turns to train")
    length_policy: Literal["drop", "keep"] = Field("drop", description="rows with finish_reason 'length'")
    max_length: int | None = Field(default=None, ge=2, description="maximum tokens per row")
    overflow: Literal["drop", "truncate"] = Field("drop", description="rows longer than --max-length")
    verify_share: float = Field(default=1.0, ge=0.0, le=1.0, description="share of rows whose mask is verified by decoding")
    use_engine_token_ids: Annotated[bool, cli("--engine-token-ids/--no-engine-token-ids")] = Field(
        True, description="use prompt/completion token ids from the engine when present"
    )
    use_generation_markers: Annotated[bool, cli("--generation-markers/--no-generation-markers")] = Field(
        True, description="use {% generation %} markers when the template has them"
    )
    end_of_turn_tokens: Annotated[list[str], cli("--end-of-turn", split=False)] = Field(
        default_factory=list, description="extra end-of-turn token(s) besides the eos ids; repeatable"
    )
    chat_template_kwargs: Annotated[dict[str, Any], cli("--template-arg")] = Field(
        default_factory=dict, description="chat template kwarg KEY=VALUE (JSON value); repeatable"
    )
    workers: int | None = Field(default=None, ge=1, description="worker processes (default: CPU count)")
    chunk_size: int = Field(default=256, ge=1, description="rows per worker task (amortizes the IPC per row)")
    rows_per_shard: int = Field(default=10_000, ge=1)
    overwrite: bool = Field(False, description="replace shards an earlier run left in --out")
    resume: bool = Field(False, description="keep shards an earlier run left in --out and skip their ids")
    max_error_share: float = Field(
        default=0.01, ge=0.0, le=1.0, description="fail when more than this share of rows cannot be masked"
    )
    progress: bool = Field(True, description="show a progress bar")
    split: str | None = Field(None, description="DatasetDict split to read (default: train, else the only one)")
    force_resume: bool = Field(False, description="resume into --out although it was written with other settings")
    max_row_bytes: int | None = Field(
        DEFAULT_MAX_ROW_BYTES, ge=1, description="JSONL rows longer than this are dropped unread (counted as row_too_large)"
    )

    def output_settings(self) -> dict[str, Any]:
        """The options that shape the rows (a resume with others would mix two datasets)."""
        keys = ("train_turns", "length_policy", "max_length", "overflow", "use_engine_token_ids",
                "use_generation_markers", "end_of_turn_tokens", "chat_template_kwargs")  # fmt: skip
        return self.model_dump(mode="json", include=set(keys))

    def masker_config(self) -> MaskerConfig:
        return MaskerConfig(
            train_turns=self.train_turns,
            length_policy=self.length_policy,
            max_length=self.max_length,
            overflow=self.overflow,
            verify_share=self.verify_share,
            use_engine_token_ids=self.use_engine_token_ids,
            use_generation_markers=self.use_generation_markers,
            end_of_turn_tokens=tuple(self.end_of_turn_tokens),
            chat_template_kwargs=tuple(sorted(self.chat_template_kwargs.items())),
        )


class TokenizeConfig(TokenizeOptions):
    """A whole `draftsmith tokenize` run: what to read, with which tokenizer, where to write, and how."""

    inputs: Annotated[list[Path], cli(positional=True)] = Field(
        description="conversation rows: JSONL/Parquet/Arrow files, dirs of them, or datasets dirs"
    )
    tokenizer: Annotated[str, cli("--tokenizer", "-t")] = Field(
        description="target model or tokenizer dir (its chat template is used)"
    )
    out: Annotated[Path, cli("--out", "-o")] = Field(description="output directory for part-NNNNN.parquet shards")

    def options(self) -> TokenizeOptions:
        return TokenizeOptions.model_validate(self.model_dump(include=set(TokenizeOptions.model_fields)))


class TokenizeSummary(BaseModel):
    """What a tokenize run read, wrote and dropped (also written as `tokenize_summary.json`)."""

    kind: str = "draftsmith.tokenize"
    version: int = 1
    output_dir: str
    tokenizer: str
    inputs: list[str]
    input_rows: int = 0
    written: int = 0
    previously_written: int = 0
    skipped_already_written: int = 0
    dropped: dict[str, int] = Field(default_factory=dict)
    errors: int = 0
    by_method: dict[str, int] = Field(default_factory=dict)
    verified: int = 0
    truncated: int = 0
    kept_length: int = 0
    end_of_turn_appended: int = 0
    total_tokens: int = 0
    trainable_tokens: int = 0
    shards: list[str] = Field(default_factory=list)
    elapsed_s: float = 0.0
    samples_per_s: float = 0.0
    options: dict[str, Any] = Field(default_factory=dict)
    examples: dict[str, list[str]] = Field(default_factory=dict)

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def render(self, console) -> None:
        """Print the counts as a rich table, one example per drop reason, and the verdict."""
        from rich.table import Table

        table = Table(title=f"tokenize -> {self.output_dir}", show_header=True)
        table.add_column("what")
        table.add_column("rows", justify="right")
        table.add_row("input rows", str(self.input_rows))
        if self.previously_written:
            table.add_row("already in the output (resumed)", str(self.skipped_already_written))
        table.add_row("written", str(self.written))
        for method, count in sorted(self.by_method.items()):
            table.add_row(f"  built by {method}", str(count))
        table.add_row("  verified by decoding", str(self.verified))
        if self.truncated:
            table.add_row("  truncated to max length", str(self.truncated))
        if self.kept_length:
            table.add_row("  finish_reason length, kept", str(self.kept_length))
        if self.end_of_turn_appended:
            table.add_row("  end-of-turn appended to engine ids", str(self.end_of_turn_appended))
        for reason, count in sorted(self.dropped.items()):
            table.add_row(f"dropped: {reason}", str(count))
        console.print(table)
        for reason, examples in sorted(self.examples.items()):
            for example in examples[:1]:
                console.print(f"  e.g. {reason}: {example}", markup=False, highlight=False)
        console.print(self.verdict(), markup=False, highlight=False)

    def verdict(self) -> str:
        drops = ", ".join(f"{reason} {count}" for reason, count in sorted(self.dropped.items())) or "none"
        share = self.trainable_tokens / self.total_tokens if self.total_tokens else 0.0
        resumed = f" (resumed: {self.previously_written} rows were already there)" if self.previously_written else ""
        return (
            f"wrote {self.written} of {self.input_rows} rows{resumed} in {len(self.shards)} shard(s), "
            f"{self.total_tokens} tokens ({share:.1%} trained); dropped: {drops}"
        )


@dataclass
class ChunkResult:
    rows: list[MaskedRow] = field(default_factory=list)
    drops: list[tuple[str, str, str, str]] = field(default_factory=list)  # reason, id, where, detail
    skipped: int = 0  # already in the output (resume)


_WORKER_MASKER: ChatMasker | None = None
_WORKER_SKIP_IDS: frozenset[str] = frozenset()


def _init_worker(tokenizer_path: str, config: MaskerConfig, skip_ids: frozenset[str]) -> None:
    global _WORKER_MASKER, _WORKER_SKIP_IDS
    ignore_interrupts_in_worker()  # the parent stops the pool on Ctrl-C/SIGTERM (core.signals)
    _WORKER_SKIP_IDS = skip_ids
    # The worker processes are the parallelism; tokenizers' own threads would oversubscribe.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER_MASKER = ChatMasker.from_path(tokenizer_path, config)


def masker_row(record: Record) -> dict[str, Any]:
    """The row the masker builds from: a checked conversation (an assistant turn has
    ``reasoning_content`` only when it carries reasoning, "" for an empty think block), its tools
    and engine fields."""
    conversation = parse_conversation(record)
    return {
        "id": conversation.id,
        "messages": conversation.messages,
        "tools": conversation.tools,
        **engine_fields(conversation),
        "where": record.where,
    }


def process_chunk(
    records: list[Record], masker: ChatMasker | None = None, skip_ids: frozenset[str] | None = None
) -> ChunkResult:
    masker = masker or _WORKER_MASKER
    skip_ids = _WORKER_SKIP_IDS if skip_ids is None else skip_ids
    assert masker is not None, "process_chunk needs a masker (workers get one from _init_worker)"
    result = ChunkResult()
    for record in records:
        if record.oversized is not None:
            result.drops.append(("row_too_large", "?", record.where, f"{record.oversized:,} bytes"))
            continue
        row = masker_row(record)  # InputError propagates: malformed input stops the run
        if row["id"] in skip_ids:
            result.skipped += 1
            continue
        try:
            built = masker.build(row)
            built.where = record.where
            result.rows.append(built)
        except RowDropped as dropped:
            result.drops.append((dropped.reason, row["id"], record.where, dropped.detail))
    return result


def _chunked(records: Iterable[Record], size: int) -> Iterator[list[Record]]:
    chunk: list[Record] = []
    for record in records:
        chunk.append(record)
        if len(chunk) >= size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _start_pool(tokenizer_path: str, config: MaskerConfig, workers: int, skip_ids: frozenset[str]):
    """Worker processes, started now: before the progress bar's thread exists, so a fork copies
    no thread's held lock. None when the work runs in this process."""
    if workers <= 1:
        return None
    import multiprocessing

    # fork where there is one: spawn would re-import the caller's script in every worker (scripts
    # without a __main__ guard break) and pay the transformers import per worker.
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    pool = ProcessPoolExecutor(
        max_workers=workers,
        mp_context=multiprocessing.get_context(method),
        initializer=_init_worker,
        initargs=(tokenizer_path, config, skip_ids),  # fork: the id set is inherited, not copied
    )
    pool.submit(int).result()  # with fork, the first submit starts every worker
    return pool


def _run_chunks(
    chunks: Iterator[list[Record]], pool: ProcessPoolExecutor | None, masker: ChatMasker,
    workers: int, skip_ids: frozenset[str],
) -> Iterator[ChunkResult]:
    if pool is None:
        for chunk in chunks:
            yield process_chunk(chunk, masker, skip_ids)
        return
    pending: deque = deque()
    for chunk in chunks:
        pending.append(pool.submit(process_chunk, chunk))
        if len(pending) >= 4 * workers:
            yield pending.popleft().result()
    while pending:
        yield pending.popleft().result()


def tokenize_dataset(
    inputs: str | Path | Iterable[str | Path],
    tokenizer_path: str | Path,
    output_dir: str | Path,
    options: TokenizeOptions | None = None,
) -> TokenizeSummary:
    """Tokenize conversation rows (contract 1) into Parquet shards of masked rows (contract 2).

    Raises `InputError` for malformed input (naming the file and line) and `TokenizeError` when
    more than `options.max_error_share` of the rows could not be masked correctly; the shards
    and `tokenize_summary.json` are written either way. A second run on the same `output_dir`
    while this one holds it is refused.
    """
    require_output_dir(output_dir, "--out")
    with lock_directory(output_dir, "tokenize"):
        return _tokenize_dataset(inputs, tokenizer_path, output_dir, options)


def _tokenize_dataset(
    inputs: str | Path | Iterable[str | Path],
    tokenizer_path: str | Path,
    output_dir: str | Path,
    options: TokenizeOptions | None,
) -> TokenizeSummary:
    options = options or TokenizeOptions()
    if options.resume and options.overwrite:
        raise InputError("choose one of resume and overwrite")
    if isinstance(inputs, (str, Path)):
        inputs = [inputs]
    paths = resolve(inputs, options.split)
    output = Path(output_dir)
    tokenizer_path = str(tokenizer_path)
    masker = ChatMasker.from_path(tokenizer_path, options.masker_config())  # a bad tokenizer fails here
    existing = prepare_output_dir(output, options.overwrite, options.resume)
    if not existing:  # nothing kept from an earlier run: its settings do not matter
        (output / MANIFEST_NAME).unlink(missing_ok=True)
    settings = {"tokenizer": tokenizer_fingerprint(tokenizer_path), **options.output_settings()}
    check_manifest(output, "tokenize", settings, force=options.force_resume)
    set_complete(output, False)  # until the summary is written; train refuses the shards before
    skip_ids = frozenset(written_ids(output, existing))
    workers = options.workers or max(1, min(os.cpu_count() or 1, 8))

    summary = TokenizeSummary(
        output_dir=str(output),
        tokenizer=tokenizer_path,
        inputs=[str(path) for path in paths],
        options=options.model_dump(mode="json"),
    )
    dropped: Counter[str] = Counter()
    by_method: Counter[str] = Counter()
    summary.previously_written = len(skip_ids)
    seen_ids: set[str] = set()
    writer = ShardWriter(output, options.rows_per_shard, existing)
    started = time.perf_counter()
    total = count_records(paths) if options.progress else None
    if total == 0:  # said before a progress bar is drawn, so the error is the only line
        raise InputError(f"{', '.join(summary.inputs)}: no rows to tokenize")

    def drop(reason: str, row_id: str, where: str, detail: str) -> None:
        dropped[reason] += 1
        examples = summary.examples.setdefault(reason, [])
        if len(examples) < EXAMPLES_PER_REASON:
            examples.append(f"{where} ({row_id}): {detail}")

    pool = _start_pool(tokenizer_path, options.masker_config(), workers, skip_ids)
    with contextlib.ExitStack() as stack:
        if pool is not None:
            stack.callback(pool.shutdown, wait=True, cancel_futures=True)
        progress = stack.enter_context(Progress("tokenize", total, unit="rows", enabled=options.progress))
        chunks = _chunked(iter_records(paths, options.max_row_bytes), options.chunk_size)
        for result in _run_chunks(chunks, pool, masker, workers, skip_ids):
            summary.skipped_already_written += result.skipped
            for reason, row_id, where, detail in result.drops:
                drop(reason, row_id, where, detail)
            for row in result.rows:
                if row.id in seen_ids:
                    drop("duplicate_id", row.id, row.where, "an earlier row has the same id; kept the first")
                    continue
                seen_ids.add(row.id)
                writer.add(row.id, row.input_ids, row.loss_mask, row.finish_reason)
                summary.written += 1
                by_method[row.method] += 1
                summary.verified += row.verified
                summary.truncated += row.truncated
                summary.kept_length += row.finish_reason == "length"
                summary.end_of_turn_appended += row.end_of_turn_appended
                summary.total_tokens += len(row.input_ids)
                summary.trainable_tokens += int(row.loss_mask.sum())
            processed = len(result.rows) + len(result.drops) + result.skipped
            summary.input_rows += processed
            progress.advance(processed, dropped=f"{sum(dropped.values()):,}")
            errors = sum(count for reason, count in dropped.items() if reason not in POLICY_REASONS)
            if summary.input_rows >= FAIL_FAST_ROWS and summary.written == 0 and errors == summary.input_rows:
                summary.dropped, summary.errors = dict(dropped), errors
                _finish(summary, writer, by_method, started, output)
                raise TokenizeError(_error_message(summary, early=True), summary)
    summary.dropped = dict(dropped)
    summary.errors = sum(count for reason, count in dropped.items() if reason not in POLICY_REASONS)
    _finish(summary, writer, by_method, started, output)
    if summary.input_rows == 0:
        raise InputError(f"{', '.join(summary.inputs)}: no rows to tokenize")
    if summary.errors / summary.input_rows > options.max_error_share:
        raise TokenizeError(_error_message(summary, early=False), summary)
    if summary.written == 0 and summary.skipped_already_written == 0:
        raise TokenizeError(f"no row was written: {summary.verdict()}. Details in {output / SUMMARY_NAME}", summary)
    # Only a run that passed its error gates is complete; train and extract refuse any other.
    set_complete(output, True)
    return summary


def _finish(summary: TokenizeSummary, writer: ShardWriter, by_method: Counter, started: float, output: Path) -> None:
    writer.flush()
    summary.shards = list(writer.shards)
    summary.by_method = dict(by_method)
    summary.elapsed_s = round(time.perf_counter() - started, 3)
    summary.samples_per_s = round(summary.input_rows / summary.elapsed_s, 1) if summary.elapsed_s else 0.0
    write_json_atomic(output / SUMMARY_NAME, summary.to_dict())


def _error_message(summary: TokenizeSummary, early: bool) -> str:
    reasons = {reason: count for reason, count in summary.dropped.items() if reason not in POLICY_REASONS}
    first = next(iter(sorted(reasons, key=reasons.get, reverse=True)), None)
    example = summary.examples.get(first, ["?"])[0] if first else "?"
    lead = (
        f"the first {summary.input_rows} rows all failed to mask"
        if early
        else f"{summary.errors} of {summary.input_rows} rows could not be masked correctly"
    )
    return (
        f"{lead} ({', '.join(f'{r} {c}' for r, c in sorted(reasons.items()))}); e.g. {example}. "
        f"Details in {Path(summary.output_dir) / SUMMARY_NAME}"
    )

