"""`lock_holder`: who writes a directory, read from its lock file without taking the lock (what
`draftsmith status` judges a writer by)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from draftsmith.core.lock import DirectoryLock, lock_holder


def test_a_live_holder_a_finished_run_and_no_lock(tmp_path):
    lock = tmp_path / ".draftsmith.lock"
    assert lock_holder(lock) == {"pid": None, "host": None, "what": None, "alive": False}  # never locked
    with DirectoryLock(tmp_path, "generate"):
        assert lock_holder(lock) == {"pid": os.getpid(), "host": socket.gethostname(), "what": "generate", "alive": True}
        with lock.open() as handle:  # reading it never disturbs the holder
            assert handle.read().startswith(str(os.getpid()))
    assert lock_holder(lock)["pid"] is None  # a finished run empties the file


def test_a_killed_holder_a_reused_pid_and_another_host(tmp_path):
    lock = tmp_path / ".draftsmith.lock"
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock.write_text(f"{child.stdout.strip()} {socket.gethostname()} generate\n")  # what a kill -9 leaves
    assert lock_holder(lock)["alive"] is False
    # A live process with that pid but no flock on the file: the pid was reused, the writer is gone.
    lock.write_text(f"{os.getpid()} {socket.gethostname()} generate\n")
    assert lock_holder(lock)["alive"] is False
    lock.write_text("4242 some-other-node generate shard 1/8\n")
    assert lock_holder(lock) == {"pid": 4242, "host": "some-other-node", "what": "generate shard 1/8", "alive": None}


def test_a_pid_no_kernel_hands_out_is_no_pid_for_status_and_for_a_takeover(tmp_path):
    """10^20 and 2^32 overflowed os.kill, "²" is a digit to str.isdigit but not to int (issue 34 item 8)."""
    lock = tmp_path / ".draftsmith.lock"
    for pid in (str(10**20), str(2**32), "²", "0", "9" * 5000):
        lock.write_text(f"{pid} {socket.gethostname()} generate\n")
        assert lock_holder(lock) == {"pid": None, "host": None, "what": None, "alive": False}
        messages: list[str] = []
        with DirectoryLock(tmp_path, "generate", log=messages.append):  # a writer takes the lock over
            assert lock_holder(lock)["pid"] == os.getpid()
        assert messages == []  # no pid was recorded: nobody to name as taken over from


def test_a_fifo_or_a_device_at_the_lock_name_is_one_line_and_a_huge_record_is_read_in_part(tmp_path):
    import pytest

    from draftsmith.core.errors import InputError

    lock = tmp_path / ".draftsmith.lock"
    os.mkfifo(lock)
    with pytest.raises(InputError, match="not a regular file \\(a FIFO\\)"):
        lock_holder(lock)
    lock.unlink()
    lock.symlink_to("/dev/zero")
    with pytest.raises(InputError, match="a character device"):
        lock_holder(lock)
    lock.unlink()
    lock.write_text(f"4242 some-other-node {'x' * 10_000_000}")
    assert lock_holder(lock)["what"] == "x" * (4096 - len("4242 some-other-node "))
