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


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity, which a container or `taskset` narrows)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def threads_for_load(cpus: int | None = None, load: float | None = None) -> tuple[int, str]:
    """A default thread count for compute that synchronises its threads every step (llama.cpp's
    spinning barriers, torch's intra-op pools): one per CPU that the machine's 1-minute load leaves
    idle, at least one. With every core, a thread that another process pushes off its core stalls
    all the others at each barrier: on a loaded 2-core machine llama-server and eval ran about 10x
    slower on 2 threads than on 1. Returns the count and the line that says why (for stderr).
    """
    cpus = usable_cpus() if cpus is None else cpus
    if load is None:
        try:
            load = os.getloadavg()[0]
        except (AttributeError, OSError):  # no load average on this platform
            return cpus, f"{cpus} (every CPU: this platform reports no load; --threads N to choose)"
    threads = max(1, min(cpus, int(cpus - load + 0.5)))
    return threads, (f"{threads} ({cpus} CPUs, 1-minute load {load:.1f}: one per idle CPU; "
                     f"--threads N to choose)")


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
