"""One writer per output directory.

A stage that writes a directory holds an exclusive ``flock`` on ``DIR/.draftsmith.lock`` for the whole
run, with its pid and host recorded in the file. A second writer is refused with one line naming the
holder. The kernel drops a flock when its process dies, so a crashed run never blocks the next one;
the pid it left in the file tells the next run that it is taking over, and it says so on stderr.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

from draftsmith.core.errors import InputError
from draftsmith.core.paths import require_output_dir

LOCK_NAME = ".draftsmith.lock"


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
    pid = int(parts[0]) if parts and parts[0].isdigit() else None
    return pid, (parts[1] if len(parts) > 1 else "?"), (parts[2].strip() if len(parts) > 2 else "")


class DirectoryLock:
    """Exclusive lock on an output directory (created if missing); a context manager."""

    def __init__(self, directory: str | Path, what: str = "draftsmith", *, lock_file: str | Path | None = None,
                 log: Callable[[str], None] | None = None):
        self.directory = Path(directory)
        self.path = Path(lock_file) if lock_file is not None else self.directory / LOCK_NAME
        self.what = what
        self.log = log or (lambda message: print(message, file=sys.stderr, flush=True))
        self._fd: int | None = None

    def acquire(self) -> DirectoryLock:
        require_output_dir(self.directory, "output directory")
        require_output_dir(self.path.parent, "lock directory")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
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

    def __exit__(self, *exc) -> None:
        self.release()


@contextlib.contextmanager
def lock_directory(directory: str | Path, what: str = "draftsmith", **options) -> Iterator[DirectoryLock]:
    """``with lock_directory(out, "generate"):`` -- hold ``out`` exclusively for the block."""
    lock = DirectoryLock(directory, what, **options)
    with lock:
        yield lock
