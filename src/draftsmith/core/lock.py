"""One writer per output directory.

A stage that writes a directory holds an exclusive ``flock`` on ``DIR/.draftsmith.lock`` for the whole
run, with its pid and host recorded in the file. A second writer is refused with one line naming the
holder. The kernel drops a flock when its process dies, so a crashed run never blocks the next one;
the pid it left in the file tells the next run that it is taking over, and it says so on stderr.

A directory also belongs to ONE stage: the first stage that locks it records itself in
``DIR/.draftsmith-owner`` (created atomically, never rewritten), and any other stage that tries to
lock it is refused with one line naming the directory, its owner and the fix -- so tokenize can never
write into a generate directory, nor train into its own tokenized data. A directory written before
the record existed is recognised by what it holds (its ``manifest.json``'s stage, or a stage's own
files), so it still resumes.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from draftsmith.core.errors import InputError
from draftsmith.core.io import fresh_file, open_own_file
from draftsmith.core.paths import require_output_dir, sibling_name
from draftsmith.core.readers import BadJSONError, read_json, read_regular_bytes

LOCK_NAME = ".draftsmith.lock"
OWNER_NAME = ".draftsmith-owner"
#: A lock record is one short line ("pid host what"); a reader takes no more than this of it.
LOCK_RECORD_BYTES = 4096
#: The largest pid any kernel hands out (Linux caps pid_max at 2^22; pid_t is 32-bit signed).
MAX_PID = 2**31 - 1
_OWNER_BYTES = 4096

# How a directory written before the owner record existed shows its stage (first match wins).
_LEGACY_FILES = (
    (".draftsmith-demo", "demo"),
    ("tokenize_summary.json", "tokenize"),
    ("generated-*.jsonl", "generate"),
    ("features-*.safetensors", "extract"),
    ("checkpoints", "train"),
    ("train_log.jsonl", "train"),
    ("train_summary.json", "train"),
)


def _legacy_owner(directory: Path) -> str | None:
    try:
        manifest = read_json(directory / "manifest.json", "run manifest", missing_ok=True)
    except BadJSONError:
        manifest = None
    if isinstance(manifest, dict) and isinstance(manifest.get("stage"), str) and manifest["stage"]:
        return manifest["stage"].split()[0]
    for pattern, stage in _LEGACY_FILES:
        if next(iter(directory.glob(pattern)), None) is not None:
            return stage
    return None


def directory_owner(directory: str | Path) -> str | None:
    """The stage an output directory belongs to (None: nobody has claimed it yet)."""
    directory = Path(directory)
    try:
        record = read_json(directory / OWNER_NAME, "owner record", max_bytes=_OWNER_BYTES, missing_ok=True)
    except BadJSONError as error:
        raise InputError(f"{error}; an unreadable owner record: delete it if this directory is yours") from None
    if record is None:
        return _legacy_owner(directory) if directory.is_dir() else None
    stage = record.get("stage") if isinstance(record, dict) else None
    if not isinstance(stage, str) or not stage:
        raise InputError(f"{directory / OWNER_NAME}: not a draftsmith owner record; delete it if this directory is yours")
    return stage


def _refuse(directory: Path, owner: str, stage: str) -> InputError:
    return InputError(
        f"{directory}: belongs to `{owner}` (it is that stage's output directory); `{stage}` writes only a "
        f"directory of its own: give {stage} a new output directory"
    )


def check_owner(directory: str | Path, stage: str) -> None:
    """Refuse `stage` writing `directory` when another stage owns it."""
    directory = Path(directory)
    owner = directory_owner(directory)
    if owner is not None and owner != stage:
        raise _refuse(directory, owner, stage)


def claim_directory(directory: str | Path, stage: str) -> None:
    """Record `stage` as the owner of the (existing) `directory`, or refuse if another stage owns it.

    The record is linked into place, so of two stages claiming one new directory at once exactly one
    wins and the other is refused.
    """
    directory = Path(directory)
    check_owner(directory, stage)
    path = directory / OWNER_NAME
    if path.exists():
        return
    temporary = fresh_file(directory / f".{OWNER_NAME}.{os.getpid()}.tmp")
    try:
        temporary.write_text(json.dumps({"stage": stage}) + "\n", encoding="utf-8")
        os.link(temporary, path)
    except FileExistsError:
        pass
    finally:
        temporary.unlink(missing_ok=True)
    check_owner(directory, stage)


def lock_beside(path: str | Path) -> Path:
    """The lock of an output replaced as a whole (an export, a demo workdir, one output file): it
    lives beside it, ``.NAME.draftsmith.lock`` (shortened to fit for a name near the length limit)."""
    return sibling_name(path, ".", ".draftsmith.lock")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _holder(text: str) -> tuple[int | None, str, str]:
    """(pid, host, what) recorded in a lock file: ``pid host what``."""
    parts = text.split(maxsplit=2)
    # Only a pid a kernel could hand out: "²" is a digit to str.isdigit, and 10^20 overflows os.kill.
    digits = parts[0] if parts and parts[0].isascii() and parts[0].isdigit() and len(parts[0]) <= 10 else ""
    pid = int(digits) if digits and 0 < int(digits) <= MAX_PID else None
    return pid, (parts[1] if len(parts) > 1 else "?"), (parts[2].strip() if len(parts) > 2 else "")


def _flock_held(path: Path) -> bool | None:
    """Whether some process holds a flock on `path`, from /proc/locks (None: cannot tell). Reading it
    takes no lock, so a watcher never disturbs the writer."""
    try:
        inode = path.stat().st_ino
        text = Path("/proc/locks").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        fields = line.split()
        if "FLOCK" in fields and len(fields) > 5 and fields[-3].rsplit(":", 1)[-1] == str(inode):
            return True
    return False


def _process_alive(pid: int) -> bool:
    """A live process (a zombie, killed but not yet reaped by its parent, is dead)."""
    if not _pid_alive(pid):
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state not in ("Z", "X")


def lock_holder(path: str | Path) -> dict:
    """Who writes under the lock file `path`, read without taking the lock: ``{"pid", "host", "what",
    "alive"}``; alive is True/False on this host, None for a writer on another host, and False with pid
    None when no run holds it (a finished run empties the file; a killed one leaves its pid)."""
    path = Path(path)
    try:  # a FIFO or a link to a device at the lock's name is refused, and no more than a record is read
        text = read_regular_bytes(path, LOCK_RECORD_BYTES, truncate=True).decode("utf-8", "replace")
    except FileNotFoundError:
        text = ""
    pid, host, what = _holder(text)
    if pid is None:
        return {"pid": None, "host": None, "what": None, "alive": False}
    if host != socket.gethostname():
        return {"pid": pid, "host": host, "what": what, "alive": None}
    alive = _process_alive(pid) and _flock_held(path) is not False  # a pid reused by another process holds no flock
    return {"pid": pid, "host": host, "what": what, "alive": alive}


def _flock_free(path: Path) -> bool:
    """Whether a shared flock on ``path`` can be had now (taken and dropped at once): for a lock
    whose holder is on another host, where /proc says nothing."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def live_writer(directory: str | Path) -> str | None:
    """``pid N on HOST (what)`` of a run now writing ``directory`` (holding its ``.draftsmith.lock``
    or a generate shard's ``.draftsmith.<shard>.lock``), else None: a reader asks this before taking
    what is there as the whole output. A killed writer's stale pid counts as finished."""
    directory = Path(directory)
    if not directory.is_dir():
        return None
    for path in sorted(directory.glob(".draftsmith*.lock")):
        if path.is_symlink() or not path.is_file():
            continue
        holder = lock_holder(path)
        if holder["alive"] or (holder["alive"] is None and not _flock_free(path)):
            return f"pid {holder['pid']} on {holder['host']}" + (f" ({holder['what']})" if holder["what"] else "")
    return None


class DirectoryLock:
    """Exclusive lock on an output directory (created if missing); a context manager."""

    def __init__(self, directory: str | Path, what: str = "draftsmith", *, lock_file: str | Path | None = None,
                 log: Callable[[str], None] | None = None, stage: str | None = None, own: bool = True):
        self.directory = Path(directory)
        self.path = Path(lock_file) if lock_file is not None else self.directory / LOCK_NAME
        self.what = what
        # The owning stage: the first word of `what` ("generate shard 0/2" -> generate) unless given;
        # `own=False` locks without claiming (a lock for one output file, not a directory).
        self.stage = stage or (what.split() or ["draftsmith"])[0]
        self.own = own
        self.log = log or (lambda message: print(message, file=sys.stderr, flush=True))
        self._fd: int | None = None

    def acquire(self) -> DirectoryLock:
        require_output_dir(self.directory, "output directory")
        require_output_dir(self.path.parent, "lock directory")
        if self.own and self.directory.is_dir():
            check_owner(self.directory, self.stage)  # before even the lock file is made in there
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = open_own_file(self.path)  # never through a link planted in its place
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pid, host, what = _holder(os.pread(fd, 4096, 0).decode("utf-8", "replace"))
            os.close(fd)
            holder = f"pid {pid} on {host}" + (f", {what}" if what else "") if pid else "another process"
            raise InputError(
                f"{self.directory}: already being written by {holder}; wait for it to finish or stop it "
                f"(lock {self.path})"
            ) from None
        if self.own and self.directory.is_dir():
            try:  # another stage's directory is refused before this run touches anything in it
                check_owner(self.directory, self.stage)
            except BaseException:
                fcntl.flock(fd, fcntl.LOCK_UN)
                os.close(fd)
                raise
        previous = os.pread(fd, 4096, 0).decode("utf-8", "replace")
        pid, host, what = _holder(previous)
        if pid is not None and pid != os.getpid():
            state = "dead" if host == socket.gethostname() and not _pid_alive(pid) else "gone"
            self.log(
                f"draftsmith: taking over the lock on {self.directory} left by {state} pid {pid} on {host}"
                + (f" ({what})" if what else "")
            )
        record = f"{os.getpid()} {socket.gethostname()} {self.what}\n".encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)
        os.fsync(fd)
        self._fd = fd
        # A directory replaced as a whole at the end (its lock lives beside it, like export's) is
        # claimed only once it is in place; every other one now, before the stage writes into it.
        if self.own and self.path.parent == self.directory:
            try:
                if self.directory.is_dir():
                    claim_directory(self.directory, self.stage)
            except BaseException:
                self.release()
                raise
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        # Emptied, not deleted: unlinking would let a waiter lock a file that no longer has a name.
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def __enter__(self) -> DirectoryLock:
        return self.acquire()

    def __exit__(self, kind, *exc) -> None:
        try:
            # A directory made during the run (or renamed into place, like export's) is claimed at the end.
            if kind is None and self.own and self.directory.is_dir():
                claim_directory(self.directory, self.stage)
        finally:
            self.release()


@contextlib.contextmanager
def waiting_lock(path: str | Path) -> Iterator[None]:
    """Hold an exclusive lock on the file `path`, waiting while another process holds it: one builder
    of a shared cache entry at a time, the others then find it built instead of building it again."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


@contextlib.contextmanager
def lock_directory(directory: str | Path, what: str = "draftsmith", **options) -> Iterator[DirectoryLock]:
    """``with lock_directory(out, "generate"):`` -- hold ``out`` exclusively for the block."""
    lock = DirectoryLock(directory, what, **options)
    with lock:
        yield lock


@contextlib.contextmanager
def lock_output_file(path: str | Path, what: str, *, flag: str = "--out", example: str = "bench.json",
                     **options) -> Iterator[DirectoryLock]:  # fmt: skip
    """Hold one output FILE (``bench.json``) against a second writer, and refuse a path that cannot be
    that file (a directory, a file in place of its folder) before any work is done."""
    path = Path(path)
    if path.is_dir():
        raise InputError(f"{flag} {path}: is a directory; {flag} names the file to write (e.g. {path / example})")
    parent = require_output_dir(path.parent, flag)
    lock = DirectoryLock(parent, what, lock_file=lock_beside(parent / path.name), own=False, **options)
    with lock:
        yield lock
