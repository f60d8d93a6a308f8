"""One way every stage stops: SIGTERM behaves exactly like Ctrl-C.

`install()` (called once, by the CLI's `main`) makes SIGTERM take Ctrl-C's path: the worker
processes this process started are stopped first (a pool waiting for them would otherwise hang,
and they would outlive it holding the output directory's lock), then the current SIGINT handler
runs (Python's, raising `KeyboardInterrupt`, or asyncio's, cancelling the running stage), so every
stage unwinds through its own `finally`/`with` blocks: progress flushed, lock released, resumable.
`exit_code()` is then 128 + the signal (130 for Ctrl-C, 143 for SIGTERM).

A forked worker inherits the handler; there it simply dies of SIGTERM as a worker should.
`ignore_interrupts_in_worker()` is for a pool's initializer: a Ctrl-C at the terminal reaches the
whole process group, and the parent, not each worker, is the one that stops (no traceback per
worker).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
from types import FrameType

_owner_pid: int | None = None
_received: int | None = None


def install() -> None:
    """Route SIGTERM through the Ctrl-C path for this process (idempotent)."""
    global _owner_pid, _received
    _owner_pid, _received = os.getpid(), None
    if threading.current_thread() is not threading.main_thread():
        return  # only the main thread may set handlers (a caller's own thread keeps its process's)
    signal.signal(signal.SIGTERM, _on_terminate)


def exit_code() -> int:
    return 128 + (_received or signal.SIGINT)


def describe() -> str:
    """One line for stderr after the run stopped."""
    if _received == signal.SIGTERM:
        return "draftsmith: terminated (SIGTERM)"
    return "draftsmith: interrupted"


def stop_children() -> None:
    """Terminate the worker processes this process started (multiprocessing / process pools)."""
    for child in multiprocessing.active_children():
        try:
            child.terminate()
        except (OSError, ValueError):
            pass


def ignore_interrupts_in_worker() -> None:
    """In a worker process: leave Ctrl-C to the parent, and die of SIGTERM like any process."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def interrupted_by(signum: int) -> None:
    """Stop this run as if by Ctrl-C, reporting `signum` (for a process with handlers of its own)."""
    global _received
    _received = signum
    raise KeyboardInterrupt


def _on_terminate(signum: int, frame: FrameType | None) -> None:
    global _received
    if os.getpid() != _owner_pid:  # a forked child inherited this handler: die as SIGTERM means
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGTERM)
        return
    _received = signum
    stop_children()
    handler = signal.getsignal(signal.SIGINT)
    if callable(handler):  # Python's default (raises KeyboardInterrupt) or asyncio's (cancels the task)
        handler(signal.SIGINT, frame)
        return
    raise KeyboardInterrupt  # SIGINT ignored (a background job): stop all the same
