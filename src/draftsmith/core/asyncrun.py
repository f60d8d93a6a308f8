"""Running coroutines from blocking code, on uvloop when it is installed.

uvloop roughly halves the event loop's per-request CPU cost, which is what limits how many
completions/s one client process can drive (see benchmarks/bench_client_overhead.py). Set
``DRAFTSMITH_NO_UVLOOP=1`` to use the standard asyncio loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, ParamSpec, TypeVar

T = TypeVar("T")
P = ParamSpec("P")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    if os.environ.get("DRAFTSMITH_NO_UVLOOP"):
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run_async(coroutine: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run`` on the fastest available loop; from inside a running loop (a notebook),
    the coroutine runs on its own loop in a worker thread."""

    def run() -> T:
        with asyncio.Runner(loop_factory=loop_factory()) as runner:
            return runner.run(coroutine)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        running = False
    else:
        running = True
    if not running:  # outside the except block: an error in the run is not chained to this one
        return run()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(run).result()


async def in_daemon_thread(function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
    """``function(*args)`` in a daemon thread of its own, awaited without blocking the event loop.

    For a blocking call that may never return, such as opening a FIFO nobody writes to: the loop
    stays free, so the first Ctrl-C or SIGTERM cancels the await at once. ``asyncio.to_thread``
    would not do: its pool's threads are joined when the loop closes and when the interpreter exits,
    so a stuck call would hang the stop it was meant to allow. A daemon thread holds neither.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # the awaiting task was cancelled meanwhile
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        result, error = None, None
        try:
            result = function(*args, **kwargs)
        except BaseException as caught:  # handed to the awaiting task, raised there
            error = caught
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop closed while the call was blocked: nobody waits any more
            pass

    threading.Thread(target=run, name=f"draftsmith-{getattr(function, '__name__', 'call')}", daemon=True).start()
    return await future
