"""Append-only output shards, the resume index and the failures file.

Layout of an output directory (several ``--shard i/N`` runs may share it):

* ``generated-s{i}of{N}-{k:05d}.jsonl``: generated rows (contract 1). Every run appends to a *new*
  part ``k``; a row is written only once its sample is complete, handed to the OS at once (or, in
  the pipeline, at the end of the event-loop iteration that completed it) and ``fsync``'d at least
  every ``fsync_interval_s`` and at close (bounds what a power cut can lose). A row lost that way
  was never on disk, so resume simply generates it again: nothing is duplicated.
* ``failures-s{i}of{N}.jsonl``: ``{"id", "reason", "attempts", "endpoint", "time"}`` per sample that
  failed permanently, appended; a later successful run supersedes it (generated rows win).
* ``summary-s{i}of{N}.json``: the last run's ``GenerateSummary`` (written atomically).
* ``progress-s{i}of{N}.json``: the running shard's progress record (`draftsmith.data.run_records`):
  rows, output tokens and lengths per part up to a byte offset, failures, start time, pid and host,
  rewritten atomically every few seconds, for `draftsmith status` (which reads nothing else whole).

Resume scans every ``generated-*.jsonl`` in the directory (all shards), so no sample is generated
twice. A torn last line (a crash mid-write) is not a complete row: it is cut off the file (only
those bytes) and its sample is generated again.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from draftsmith.core.errors import InputError
from draftsmith.core.io import write_json_atomic
from draftsmith.data.generated import RowWriter, line_id
from draftsmith.data.run_records import RowStats, progress_name, read_progress, thin_history
from draftsmith.data.sources import GENERATED_ROW_GLOB as ROW_GLOB


def shard_tag(index: int, count: int) -> str:
    return f"s{index}of{count}"


def _truncate_torn_tail(path: Path, log) -> None:
    """Cut an incomplete final line (no trailing newline) off ``path``."""
    size = path.stat().st_size
    if size == 0:
        return
    with path.open("rb+") as handle:
        handle.seek(-1, os.SEEK_END)
        if handle.read(1) == b"\n":
            return
        # Find the last newline; everything after it is the torn row.
        position = size
        chunk = 65536
        cut = 0
        while position > 0:
            start = max(0, position - chunk)
            handle.seek(start)
            block = handle.read(position - start)
            index = block.rfind(b"\n")
            if index >= 0:
                cut = start + index + 1
                break
            position = start
        handle.truncate(cut)
        handle.flush()
        os.fsync(handle.fileno())
    log(f"{path}: removed a torn last line ({size - cut} bytes) left by an interrupted run")


MANIFEST_LOCK = ".draftsmith.manifest.lock"


def own_file_names(tag: str) -> list[str]:
    """The files a shard's run writes besides its row parts (all checked by `check_own_files`)."""
    return [f"failures-{tag}.jsonl", f"summary-{tag}.json", progress_name(tag), f".draftsmith.{tag}.lock",
            "manifest.json", MANIFEST_LOCK]  # fmt: skip


@contextlib.contextmanager
def manifest_lock(directory: Path) -> Iterator[None]:
    """Held (blocking, briefly) while a shard's run checks and writes the shared manifest, so two
    shards starting at once cannot both find no manifest and each write their own settings."""
    fd = os.open(Path(directory) / MANIFEST_LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def check_own_files(directory: Path, names: list[str] = ()) -> list[Path]:
    """The row shards of ``directory``, refusing (before anything is read, cut or written) any of
    them, or of ``names``, that is a symbolic link or not a plain file: the store writes and repairs
    only files inside its output directory, never a file a link points to elsewhere."""
    directory = Path(directory)
    if not directory.exists():
        return []
    paths = sorted(directory.glob(ROW_GLOB))
    for path in [*paths, *(directory / name for name in names)]:
        if path.is_symlink():
            raise InputError(f"{path}: is a symbolic link (to {os.readlink(path)}); generate writes only plain files "
                             f"inside its output directory: move the link away")
        if path.exists() and not path.is_file():
            raise InputError(f"{path}: is not a plain file; move it away to continue")
    return paths


def count_row_ids(directory: Path, log=lambda message: None) -> Counter[str]:
    """How many complete rows each id has in ``directory`` (repairing torn tails first)."""
    counts: Counter[str] = Counter()
    for path in check_own_files(directory):
        _truncate_torn_tail(path, log)
        with path.open("rb") as handle:
            for number, raw in enumerate(handle, 1):
                try:
                    line = raw.decode("utf-8")
                except UnicodeDecodeError as error:
                    raise InputError(f"{path}:{number}: not UTF-8 text (byte {error.start + 1}); "
                                     f"move the file away to continue") from None
                if not line.strip():
                    continue
                sample_id = line_id(line)
                if sample_id is None:
                    raise InputError(
                        f"{path}:{number}: not a generated row (bad JSON or no 'id'); move the file away to continue"
                    )
                counts[sample_id] += 1
    return counts


def scan_done_ids(directory: Path, log=lambda message: None) -> set[str]:
    """Ids of every complete generated row in ``directory`` (repairing torn tails first)."""
    return set(count_row_ids(directory, log))


def read_failures(directory: Path, tag: str) -> dict[str, str]:
    """``id -> last reason`` from the shard's failures file (ignores a torn last line)."""
    path = directory / f"failures-{tag}.jsonl"
    failures: dict[str, str] = {}
    if not path.exists():
        return failures
    with path.open("r", encoding="utf-8", errors="replace") as handle:  # a garbled line only means a retry
        for line in handle:
            try:
                row = json.loads(line)
                failures[str(row["id"])] = str(row.get("reason"))
            except (json.JSONDecodeError, KeyError, TypeError):
                continue
    return failures


class ProgressRecord:
    """The shard's progress record (see `draftsmith.data.run_records`): kept in memory, written atomically.

    Statistics of the parts of earlier runs are carried over from the previous record (for the parts
    still there), so the record always covers every part it knows the byte offset of."""

    def __init__(self, directory: Path, tag: str, interval_s: float = 5.0):
        import socket

        self.path = directory / progress_name(tag)
        self.interval_s = interval_s
        previous = read_progress(self.path) or {}
        failures_path = directory / f"failures-{tag}.jsonl"
        failures_start = failures_path.stat().st_size if failures_path.is_file() else 0  # this run's failures follow
        parts = {name: data for name, data in (previous.get("parts") or {}).items()
                 if (directory / name).is_file() and (directory / name).stat().st_size >= int(data.get("bytes", 0))}
        self.record: dict[str, Any] = {
            "kind": "generate-progress", "version": 1, "shard": tag, "pid": os.getpid(), "host": socket.gethostname(),
            "started_at": time.time(), "first_started_at": previous.get("first_started_at") or time.time(),
            "updated_at": None, "last_row_at": previous.get("last_row_at"), "input": None, "already_done": None,
            "skipped_failed": 0, "todo": None, "settings": {}, "parts": parts, "failures_start": failures_start,
            "history": list(previous.get("history") or []),
            "rows_at_start": sum(int(part.get("rows", 0)) for part in parts.values()),
            "output_tokens_at_start": sum(int(part.get("output_tokens", 0)) for part in parts.values()),
        }  # fmt: skip
        self.stats = RowStats()
        self._written_at = 0.0

    def begin(self, **fields: Any) -> None:
        self.record.update(fields)

    def add_row(self, row: dict[str, Any]) -> None:
        self.stats.add(row)
        self.record["last_row_at"] = time.time()

    def shard_totals(self) -> tuple[int, int]:
        rows = sum(int(part.get("rows", 0)) for part in self.record["parts"].values())
        tokens = sum(int(part.get("output_tokens", 0)) for part in self.record["parts"].values())
        return rows, tokens

    def write(self, rows_path: Path | None, force: bool = False) -> None:
        """Write the record (at most every `interval_s` unless forced); the row part must be flushed."""
        now = time.time()
        if not force and now - self._written_at < self.interval_s:
            return
        self._written_at = now
        if rows_path is not None and rows_path.exists():
            self.record["parts"][rows_path.name] = {"bytes": rows_path.stat().st_size, **self.stats.to_dict()}
        self.record["updated_at"] = now
        rows, tokens = self.shard_totals()
        history = self.record["history"]
        if not history or history[-1][1:] != [rows, tokens] or now - history[-1][0] >= 60:
            history.append([round(now, 3), rows, tokens])
        self.record["history"] = thin_history(history)
        write_json_atomic(self.path, self.record, indent=None)


class OutputStore:
    """Writes generated rows and failures for one shard; drops a second row for the same id."""

    def __init__(self, directory: str | Path, shard_index: int = 0, shard_count: int = 1,
                 fsync_interval_s: float = 1.0, log=lambda message: None, progress_interval_s: float = 5.0):
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self.tag = shard_tag(shard_index, shard_count)
        self.fsync_interval_s = fsync_interval_s
        self.log = log
        self.written: set[str] = set()
        self.rows_path: Path | None = None
        self._rows: RowWriter | None = None
        self._failures: TextIO | None = None
        self._last_sync = time.monotonic()
        self.rows_written = 0
        self.flush_soon = None
        """Optional callable that schedules ``flush()`` shortly (an event loop coalescing the flushes
        of the rows finished in one loop iteration into one syscall); None: flush every row at once."""
        self.failures_written = 0
        self.progress = ProgressRecord(self.directory, self.tag, progress_interval_s)

    def scan(self) -> set[str]:
        """Complete rows already in the directory (any shard); also seeds the duplicate filter."""
        check_own_files(self.directory, own_file_names(self.tag))
        done = scan_done_ids(self.directory, self.log)
        self.written |= done
        return done

    def previous_failures(self) -> dict[str, str]:
        return read_failures(self.directory, self.tag)

    def _next_part(self) -> Path:
        pattern = re.compile(rf"generated-{re.escape(self.tag)}-(\d+)\.jsonl$")
        parts = [int(m.group(1)) for p in self.directory.iterdir() if (m := pattern.match(p.name))]
        return self.directory / f"generated-{self.tag}-{max(parts, default=-1) + 1:05d}.jsonl"

    def open(self) -> None:
        if self._rows is None:
            self.rows_path = self._next_part()
            self._rows = RowWriter(self.rows_path)

    def write_row(self, row: dict[str, Any]) -> bool:
        """Append one complete row; False (nothing written) when its id was already written."""
        sample_id = row["id"]
        if sample_id in self.written:
            return False
        if self._rows is None:
            self.open()
        assert self._rows is not None
        self._rows.write(row, flush=self.flush_soon is None)
        if self.flush_soon is not None:
            self.flush_soon()
        self.written.add(sample_id)
        self.rows_written += 1
        self.progress.add_row(row)
        self._maybe_sync()
        return True

    def write_failure(self, sample_id: str, reason: str, attempts: int, endpoint: str | None) -> None:
        if self._failures is None:
            self._failures = (self.directory / f"failures-{self.tag}.jsonl").open("a", encoding="utf-8")
        record = {"id": sample_id, "reason": reason, "attempts": attempts, "endpoint": endpoint,
                  "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        self._failures.write(json.dumps(record, ensure_ascii=False) + "\n")
        self._failures.flush()
        self.failures_written += 1
        self._maybe_sync()

    def flush(self) -> None:
        """Hand buffered rows to the OS (a killed process then loses nothing)."""
        if self._rows is not None:
            self._rows.flush()

    def _maybe_sync(self) -> None:
        now = time.monotonic()
        if now - self._last_sync >= self.fsync_interval_s:
            self.sync()
            self._last_sync = now
        self.write_progress()

    def write_progress(self, force: bool = False) -> None:
        """The progress record, covering the rows handed to the OS so far (every few seconds, or now)."""
        if force or time.time() - self.progress._written_at >= self.progress.interval_s:
            self.flush()
            self.progress.write(self.rows_path, force=True)

    def sync(self) -> None:
        if self._rows is not None:
            self._rows.sync()
        if self._failures is not None:
            self._failures.flush()
            os.fsync(self._failures.fileno())

    def write_summary(self, summary: dict[str, Any]) -> Path:
        path = self.directory / f"summary-{self.tag}.json"
        return write_json_atomic(path, summary)

    def close(self) -> None:
        self.sync()
        if self._rows is not None:
            self._rows.close()
        if self._failures is not None:
            self._failures.close()
        self._rows = self._failures = None
        if self.progress.record["input"] is not None:  # a run that began (not a scan-only store)
            self.progress.write(self.rows_path, force=True)
