"""Running coroutines from blocking code, on uvloop when it is installed.

uvloop roughly halves the event loop's per-request CPU cost, which is what limits how many
completions/s one client process can drive (see benchmarks/bench_client_overhead.py). Set
``DRAFTSMITH_NO_UVLOOP=1`` to use the standard asyncio loop.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


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
