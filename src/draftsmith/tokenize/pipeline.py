"""`tokenize_dataset`: stream conversations, build masked rows in parallel, write Parquet shards.

The main process reads raw rows and hands chunks to worker processes (each loads the tokenizer
once); at most a few chunks per worker are in flight, so memory stays flat however large the
input. Results come back in input order, so the shards do not depend on the worker count.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Iterable, Iterator
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from draftsmith.core.limits import workers_for
from draftsmith.core.errors import DraftsmithError, InputError
from draftsmith.core.manifest import MANIFEST_NAME, check_manifest, record_partial_inputs, set_complete, tokenizer_fingerprint
from draftsmith.core.paths import require_output_dir, require_utf8_path
from draftsmith.core.io import write_json_atomic
from draftsmith.core.lock import lock_directory
from draftsmith.core.signals import ignore_interrupts_in_worker
from draftsmith.core.progress import Progress
from draftsmith.tokenize.config import TokenizeOptions, TokenizeSummary
from draftsmith.data.template_probe import probe_chat_template, tokenizer_template_variables
from draftsmith.tokenize.masking import (
    POLICY_REASONS, ChatMasker, MaskedRow, MaskerConfig, RowDropped, load_tokenizer, template_text,
)
from draftsmith.data.conversation import conversation_from_row
from draftsmith.data.thinking import choose_thinking
from draftsmith.data.generated import INCOMPLETE_ANSWER, engine_fields, incomplete_answer
from draftsmith.data.sources import Record, check_finished, count_records, iter_records, resolve
from draftsmith.data.tokenized import SUMMARY_NAME, ShardWriter, prepare_output_dir, written_ids

EXAMPLES_PER_REASON = 3
# Give up early when a template cannot mask anything: no point tokenizing a million rows to drop them.
FAIL_FAST_ROWS = 256


class TokenizeError(DraftsmithError):
    """Too many rows could not be masked correctly (or none was written); `summary` says why."""

    def __init__(self, message: str, summary: TokenizeSummary | None = None):
        super().__init__(message)
        self.summary = summary


@dataclass
class ChunkResult:
    rows: list[MaskedRow] = field(default_factory=list)
    drops: list[tuple[str, str, str, str]] = field(default_factory=list)  # reason, id, where, detail
    skipped: int = 0  # already in the output (resume)


_PR_SET_PDEATHSIG = 1
_WORKER_MASKER: ChatMasker | None = None
_WORKER_SKIP_IDS: frozenset[str] = frozenset()


def _die_with_parent(parent: int) -> None:
    """A worker must not outlive the run that started it (it would hold the output directory's
    lock and keep computing for nobody): on Linux the kernel kills it when the parent dies."""
    if sys.platform.startswith("linux"):
        import ctypes

        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # the parent died before the kernel was told
        os._exit(1)


def _init_worker(tokenizer_path: str, config: MaskerConfig, skip_ids: frozenset[str], parent: int) -> None:
    global _WORKER_MASKER, _WORKER_SKIP_IDS
    ignore_interrupts_in_worker()  # the parent stops the pool on Ctrl-C/SIGTERM (core.signals)
    _die_with_parent(parent)
    _WORKER_SKIP_IDS = skip_ids
    # The worker processes are the parallelism; tokenizers' own threads would oversubscribe.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _WORKER_MASKER = ChatMasker.from_path(tokenizer_path, config)


def masker_row(record: Record) -> dict[str, Any]:
    """The row the masker builds from: a checked conversation (an assistant turn has
    ``reasoning_content`` only when it carries reasoning, "" for an empty think block), its tools
    and engine fields. A row whose final answer is not complete (`data.generated.incomplete_answer`:
    a cut-off stream's ``finish_reason: null``, null or non-text content) is `RowDropped`."""
    decoded = record.parse()
    if record.columnar and isinstance(decoded, dict) and decoded.get("finish_reason") is None and not (
        decoded.get("completion_token_ids") is not None or decoded.get("prompt_token_ids") is not None
    ):
        # A table gives every row the column; without engine ids a null there is a plain row's absent field.
        decoded = {key: value for key, value in decoded.items() if key != "finish_reason"}
    why = incomplete_answer(decoded)
    if why is not None:
        raise RowDropped(INCOMPLETE_ANSWER, why)
    conversation = conversation_from_row(decoded, record.where)
    return {
        "id": conversation.id,
        "messages": conversation.messages,
        "tools": conversation.tools,
        "unclosed_think": conversation.unclosed_think,
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
        try:
            row = masker_row(record)  # InputError propagates: malformed input stops the run
        except RowDropped as dropped:
            result.drops.append((dropped.reason, _raw_id(record), record.where, dropped.detail))
            continue
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


def _raw_id(record: Record) -> str:
    row = record.parse()
    raw_id = row.get("id") if isinstance(row, dict) else None
    return str(raw_id) if isinstance(raw_id, (str, int)) and raw_id != "" else "?"


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
        initargs=(tokenizer_path, config, skip_ids, os.getpid()),  # fork: the id set is inherited, not copied
    )
    try:
        pool.submit(int).result()  # with fork, the first submit starts every worker
    except BaseException:
        _stop_pool(pool)
        raise
    return pool


def _stop_pool(pool: ProcessPoolExecutor) -> None:
    """Stop the workers now (an interrupt): running chunks are abandoned, a resume redoes them."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    for process in processes:
        with contextlib.suppress(OSError, ValueError, AttributeError):
            process.terminate()
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        with contextlib.suppress(OSError, ValueError, AttributeError, AssertionError):
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join(5)


@contextlib.contextmanager
def _pool_lifetime(pool: ProcessPoolExecutor | None) -> Iterator[None]:
    """Workers end with the run: shut down normally after success or a data error, stopped at once
    on Ctrl-C or SIGTERM (which then ends the run like Ctrl-C: exit 130, lock released, resumable)."""
    if pool is None:
        yield
        return
    previous = None
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        # TODO(core): the CLI's one SIGTERM handler makes this a no-op once it is installed.
        previous = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        yield
    except BaseException as error:
        if isinstance(error, Exception):
            pool.shutdown(wait=True, cancel_futures=True)
        else:
            _stop_pool(pool)
        raise
    else:
        pool.shutdown(wait=True, cancel_futures=True)
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _sigterm_as_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


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
    require_utf8_path(output_dir, "--out")  # its shards are Arrow files: refused before the directory is made
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
    partial = check_finished(inputs, options.allow_partial)
    output = Path(output_dir)
    tokenizer_path = str(tokenizer_path)
    tokenizer = load_tokenizer(tokenizer_path)  # a bad tokenizer fails here
    masker_config = options.masker_config()
    # A template that never finishes, recurses or builds gigabytes is one line before anything renders it
    # (the masker renders it to find the end-of-turn token), not a hang or a RecursionError on a row.
    probe_chat_template(template_text(tokenizer), f"--tokenizer {tokenizer_path}",
                        {**tokenizer_template_variables(tokenizer), **dict(masker_config.chat_template_kwargs)})
    masker = ChatMasker(tokenizer, masker_config, tokenizer_path)
    existing = prepare_output_dir(output, options.overwrite, options.resume)
    if not existing:  # nothing kept from an earlier run: its settings do not matter
        (output / MANIFEST_NAME).unlink(missing_ok=True)
    settings = {"tokenizer": tokenizer_fingerprint(tokenizer_path), **options.output_settings()}
    manifest = check_manifest(output, "tokenize", settings, force=options.force_resume)
    # The template record travels with the data: train copies it into the drafter's config.
    write_json_atomic(output / MANIFEST_NAME, {**manifest, "template": masker.template_record()})
    record_partial_inputs(output, partial)
    set_complete(output, False)  # until the summary is written; train refuses the shards before
    skip_ids = frozenset(written_ids(output, existing))

    summary = TokenizeSummary(
        output_dir=str(output),
        tokenizer=tokenizer_path,
        inputs=[str(path) for path in paths],
        options=options.model_dump(mode="json"),
        thinking=choose_thinking(masker.tokenizer.chat_template, options.chat_template_kwargs, send_default=False).line,
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
    # No more processes than CPUs nor than chunks of rows to hand them (a typo of --workers 100000
    # would otherwise fork that many); 8 by default.
    workers = workers_for(options.workers or 8, -(-total // options.chunk_size) if total else None, cpu_bound=True)

    def drop(reason: str, row_id: str, where: str, detail: str) -> None:
        dropped[reason] += 1
        examples = summary.examples.setdefault(reason, [])
        if len(examples) < EXAMPLES_PER_REASON:
            examples.append(f"{where} ({row_id}): {detail}")

    pool = _start_pool(tokenizer_path, options.masker_config(), workers, skip_ids)
    with contextlib.ExitStack() as stack:
        stack.enter_context(_pool_lifetime(pool))
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

