"""Atomic, durable file output: a reader sees the old file or the whole new one, never a torn one.

Everything is written to a temporary name in the destination's own directory (so the rename stays
on one filesystem), flushed to disk, renamed over the destination, and the directory entry itself is
flushed, so a power cut after return cannot bring back the old file or leave an empty one.
"""

from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from draftsmith.core.errors import DraftsmithError, InputError

DISK_FULL = (errno.ENOSPC, errno.EDQUOT)


class DiskFullError(DraftsmithError):
    """The file system ran out of space (or quota) while writing: one line, exit 2.

    ``rerun`` is the exact command that continues the work (the CLI fills it in from its argv)."""

    def __init__(self, where: str | Path | None = None, rerun: str | None = None):
        self.where = where
        super().__init__(
            (f"{where}: " if where else "") + "the disk is full (no space left on device); free some space and "
            + (f"resume with: {rerun}" if rerun else "rerun the same command") + " (what was written before is kept)"
        )


def disk_full(error: BaseException, path: str | Path | None = None) -> DiskFullError:
    return DiskFullError(path or getattr(error, "filename", None))


# How libraries that do their own I/O say it when they do not raise an OSError (safetensors' Rust
# error text; torch.save's RuntimeError carries the OSError as its context when given a file object).
_DISK_FULL_TEXTS = ("no space left on device", "disk quota exceeded", "os error 28", "os error 122")


def is_disk_full(error: BaseException, directory: str | Path | None = None) -> bool:
    """Whether ``error``, raised while writing into ``directory``, is a full disk (or quota).

    Looks through the chain of causes for an OSError with ENOSPC/EDQUOT or a library's text for it;
    for an error that says nothing (torch.save to a path: "unexpected pos"), a ``directory`` whose
    file system has no free block left decides.
    """
    if isinstance(error, (DraftsmithError, KeyboardInterrupt, SystemExit, GeneratorExit)):
        return False
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in DISK_FULL:
            return True
        if any(text in str(current).lower() for text in _DISK_FULL_TEXTS):
            return True
        current = current.__cause__ or current.__context__
    if directory is None or isinstance(error, OSError):
        return False
    try:
        status = os.statvfs(directory)
    except OSError:
        return False
    return (status.f_bfree if os.geteuid() == 0 else status.f_bavail) == 0


@contextlib.contextmanager
def disk_full_as_one_line(path: str | Path) -> Iterator[None]:
    """Around a write to ``path`` (a file or a directory being filled) by any library: a full disk,
    however the library reports it, becomes the one-line `DiskFullError` naming ``path``."""
    try:
        yield
    except BaseException as error:
        directory = Path(path) if Path(path).is_dir() else Path(path).parent
        if is_disk_full(error, directory):
            raise disk_full(error, path) from None
        raise


def _link_refused(path: Path) -> InputError:
    try:
        target = os.readlink(path)
    except OSError:
        target = "?"
    return InputError(f"{path}: is a symbolic link (to {target}); draftsmith writes only plain files inside its "
                      "output directory, never through a link: move the link away")


def refuse_replaced_link(path: str | Path, flag: str, command: str) -> Path:
    """``path`` (a directory ``command`` deletes and makes again, or replaces by a rename), unless it
    is a symbolic link: removing it would empty the link's target, which is not draftsmith's."""
    path = Path(path)
    if path.is_symlink():
        try:
            target = os.readlink(path)
        except OSError:
            target = "?"
        raise InputError(f"{flag} {path}: is a symbolic link (to {target}); {command} replaces {flag} as a whole, "
                         f"so give the directory itself ({path.resolve()}) or a new path")
    return path


def discard_path(path: str | Path) -> None:
    """Remove what a dead writer left at a staging name: a link or file is unlinked, a directory
    removed with what it holds; a link is never followed (its target is not ours)."""
    path = Path(path)
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
    elif path.exists():
        shutil.rmtree(path, ignore_errors=True)


def refuse_link(path: str | Path) -> Path:
    """``path``, unless it is a symbolic link (an `InputError`): for a file draftsmith rewrites."""
    path = Path(path)
    if path.is_symlink():
        raise _link_refused(path)
    return path


def open_own_file(path: str | Path, flags: int = os.O_RDWR | os.O_CREAT, mode: int = 0o666) -> int:
    """A descriptor for a file draftsmith writes in its own output directory (a lock, a log).

    Never through a symbolic link: one planted there (say to a file elsewhere) is refused, since
    following it would truncate or append to a file outside the output directory.
    """
    path = Path(path)
    try:
        descriptor = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise _link_refused(path) from None
        if error.errno in DISK_FULL:
            raise disk_full(error, path) from None
        raise
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        os.close(descriptor)
        raise InputError(f"{path}: is not a plain file; draftsmith writes a plain file there: move it away")
    return descriptor


def open_append(path: str | Path, encoding: str = "utf-8"):
    """``path`` opened for appending text (created if missing), never through a link."""
    return os.fdopen(open_own_file(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND), "a", encoding=encoding)


def fresh_file(path: str | Path) -> Path:
    """Make ``path`` (a temporary or staging name draftsmith owns) a new, empty plain file.

    Whatever held the name before goes first -- a file left by a crash, or a link planted there --
    so a writer that opens the name afterwards (safetensors, torch.save, Arrow) writes this new
    file and never the one a link points to.
    """
    path = Path(path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    os.close(open_own_file(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    return path


def fresh_dir(path: str | Path) -> Path:
    """Make ``path`` (a staging directory draftsmith owns) a new, empty directory; a link in its
    place is removed, not followed (``rmtree`` of a link's target would empty a directory elsewhere)."""
    path = Path(path)
    if path.is_symlink() or (path.exists() and not path.is_dir()):
        path.unlink()
    elif path.exists():
        shutil.rmtree(path)
    path.mkdir(parents=True)
    return path


def read_json_file(path: Path, what: str) -> Any:
    """A small JSON file, with errors that name it (``what``: "bench file", "model config")."""
    from draftsmith.core.readers import read_json  # the one JSON reader: plain files, bounded size and depth

    return read_json(path, what)


def temporary_name(path: str | Path) -> Path:
    """``dir/.name.tmp``: hidden, and next to ``path`` (a same-filesystem rename)."""
    from draftsmith.core.paths import sibling_name  # a name near the length limit still gets one that fits

    return sibling_name(path, ".", ".tmp")


def fsync_dir(directory: str | Path) -> None:
    """Flush a directory's entries (renames, creations) to disk; a no-op where it is not supported."""
    try:
        descriptor = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(descriptor)
    except OSError:
        pass  # some filesystems refuse fsync on directories; nothing more can be done there
    finally:
        os.close(descriptor)


def fsync_tree(path: str | Path) -> None:
    """fsync a file, or every file and directory below a directory."""
    path = Path(path)
    if path.is_dir():
        for root, _, files in os.walk(path):
            for name in files:
                fsync_tree(Path(root) / name)
            fsync_dir(root)
        return
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def current_umask() -> int:
    """This process's umask, read without changing it (``os.umask`` can only be read by setting it,
    which would race with another thread creating a file)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(path: str | Path) -> None:
    """Give ``path`` (a file, or a directory and all below it) the permissions a plain new file gets
    under the umask: writers that go through a private temporary file (``mkstemp``, safetensors,
    ``mkdtemp``) leave 0600/0700, and a model folder on a shared file system must be readable like
    every other file the user writes. Links are left alone (chmod would follow them)."""
    mask = current_umask()
    path = Path(path)
    entries = [path]
    if path.is_dir() and not path.is_symlink():
        for root, directories, files in os.walk(path):
            entries.extend(Path(root) / name for name in directories + files)
    for entry in entries:
        try:
            status = entry.lstat()
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(status.st_mode) or status.st_mode & 0o111:
            wanted = 0o777 & ~mask
        elif stat.S_ISREG(status.st_mode):
            wanted = 0o666 & ~mask
        else:
            continue
        if stat.S_IMODE(status.st_mode) != wanted:
            os.chmod(entry, wanted)


def publish(temporary: str | Path, final: str | Path) -> Path:
    """Make a finished temporary file or directory durable and rename it to ``final`` atomically;
    what appears there has the permissions the umask gives (see `follow_umask`)."""
    temporary, final = Path(temporary), Path(final)
    follow_umask(temporary)
    fsync_tree(temporary)
    os.replace(temporary, final)
    fsync_dir(final.parent)
    return final


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield a temporary path to write ``path``'s content to (with any writer); publish it on success.

    On an exception the temporary file is removed and ``path`` is untouched.
    """
    path = Path(path)
    temporary = temporary_name(path)
    try:
        fresh_file(temporary)
        yield temporary
        publish(temporary, path)
    except BaseException as error:
        with contextlib.suppress(FileNotFoundError):
            temporary.unlink()
        # Any writer's way of saying it (safetensors, torch, Arrow), caught here at the write.
        if is_disk_full(error, path.parent):
            raise disk_full(error, path) from None
        raise


def write_atomic(path: str | Path, data: str | bytes, encoding: str = "utf-8") -> Path:
    """Replace ``path`` with ``data`` atomically and durably."""
    with atomic_path(path) as temporary:
        with open(temporary, "wb") as handle:
            handle.write(data.encode(encoding) if isinstance(data, str) else data)
    return Path(path)


def finite(value: Any) -> Any:
    """``value`` with every NaN/infinity replaced by None, so it can be written as strict JSON."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def dumps_json(payload: Any, indent: int | None = 2, **options: Any) -> str:
    """Strict JSON (RFC 8259: no NaN or Infinity, which most readers reject): a non-finite number
    is written as null. Every JSON file and `--json` output goes through here."""
    return json.dumps(finite(payload), indent=indent, allow_nan=False, **options)


def write_json_atomic(path: str | Path, payload: Any, indent: int | None = 2) -> Path:
    """``payload`` as strict JSON (with a final newline), written with `write_atomic`."""
    return write_atomic(path, dumps_json(payload, indent=indent) + "\n")
