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
