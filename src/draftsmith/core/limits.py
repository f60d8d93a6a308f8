"""Numbers bounded by the work: worker and concurrency counts, and the largest row a reader takes.

A count a user may type (``--concurrency``, ``--workers``, ``--data-workers``) is an upper bound,
never a number of things to create: no stage starts more workers than it has items of work (a
million idle tasks for four prompts exhaust memory before the first request), and CPU-bound work
gets no more processes than there are CPUs.
"""

from __future__ import annotations

import os

#: The default of every reader's row-size limit: a row (a JSONL line, a JSON-array element, a table
#: row) over it is counted and skipped, never read whole into memory where that can be avoided.
DEFAULT_MAX_ROW_BYTES = 64 * 1024 * 1024
#: Environment override of `DEFAULT_MAX_ROW_BYTES` for every stage (tokenize also has a flag).
MAX_ROW_BYTES_ENV = "DRAFTSMITH_MAX_ROW_BYTES"


def workers_for(requested: int, work: int | None, *, cpu_bound: bool = False, at_least: int = 1) -> int:
    """``requested`` capped by ``work`` (the items there are to do; None when unknown) and, for
    CPU-bound work, by the CPUs this process may use; never below ``at_least`` unless asked for less."""
    count = requested
    if work is not None:
        count = min(count, max(work, at_least))
    if cpu_bound:
        count = min(count, max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1))
    return max(min(at_least, requested), count)


def max_row_bytes(configured: int | None = None) -> int:
    """The row-size limit: ``configured`` when given, else ``$DRAFTSMITH_MAX_ROW_BYTES``, else the default."""
    if configured is not None:
        return configured
    raw = os.environ.get(MAX_ROW_BYTES_ENV)
    if raw:
        from draftsmith.core.errors import InputError

        try:
            value = int(float(raw))
        except ValueError:
            raise InputError(f"${MAX_ROW_BYTES_ENV}={raw!r}: not a number of bytes") from None
        if value < 1:
            raise InputError(f"${MAX_ROW_BYTES_ENV}={raw!r}: must be at least 1 byte")
        return value
    return DEFAULT_MAX_ROW_BYTES
