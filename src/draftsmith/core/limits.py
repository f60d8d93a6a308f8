"""Numbers bounded by the work: worker and concurrency counts, the largest row a reader takes, the
ceilings every setting lives under, and the one thread policy of the CPU stages.

A count a user may type (``--concurrency``, ``--workers``, ``--data-workers``) is an upper bound,
never a number of things to create: no stage starts more workers than it has items of work (a
million idle tasks for four prompts exhaust memory before the first request), and CPU-bound work
gets no more processes than there are CPUs.

Every number a stage takes (a flag, a config-file key, a field of a measurement or device file) is
finite and below a ceiling: its field's own (``le=``), one of the named ceilings here where the
machine or the model sets it, and never above `MAX_SETTING` (core.config's number rule). A value
past them is one line naming the flag or field, before any work: past 2**63 torch wraps an integer
negative, past about 1e308 a float is infinite, and far below that a block or a thread count
allocates or spawns until the machine gives out.
"""

from __future__ import annotations

import os

#: The largest number any setting may hold, whatever its field says: well inside int64 (torch wraps
#: 2**63 to a negative) and far above any real count, rate or size (a B200's FP4 peak is 9e15 FLOP/s).
MAX_SETTING = 10**18
#: The longest sequence of tokens anything plans, trains, generates or evaluates: far beyond any
#: model's context, so a longer one is a typo (and a memory or time sink), never a setting.
MAX_SEQUENCE_TOKENS = 10**8
#: The largest draft block: DFlash drafts 16, DSpark 17, engines a few dozen at most; a block
#: allocates block x vocabulary logits per request, so 10**8 runs out of memory rather than failing.
MAX_BLOCK_SIZE = 256
#: `--threads` may ask for at most this many threads per CPU this process may use: past it a
#: thread pool only oversubscribes the machine, and at about 10**5 torch and pyarrow crash outright.
MAX_THREADS_PER_CPU = 4

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


def max_threads() -> int:
    """The most threads ``--threads`` may ask for here (`MAX_THREADS_PER_CPU` per usable CPU)."""
    return MAX_THREADS_PER_CPU * usable_cpus()


def check_threads(threads: int) -> int:
    """``threads`` when it is a thread count this machine can run; else a ValueError saying the range
    (config fields run it as a validator, so the error names the flag)."""
    ceiling = max_threads()
    if not 1 <= threads <= ceiling:
        raise ValueError(f"must be 1..{ceiling} ({MAX_THREADS_PER_CPU} per CPU of the {usable_cpus()} this process "
                         f"may use), got {threads}")
    return threads


def choose_threads(requested: int | None, *, on_cpu: bool = True) -> tuple[int, str | None]:
    """Set the torch CPU threads of a CPU-heavy stage (train, extract, eval, check, demo, plan device,
    the overfit gate): ``requested`` (``--threads``) when given, else on the CPU `threads_for_load`'s
    choice, shared among the processes torchrun starts on this machine. Returns the count and the
    line the stage says on stderr (``threads: 1 (2 CPUs, 1-minute load 3.9: ...)``) once its inputs
    are checked (a bad input stays one line); None where torch's default stands (a GPU run)."""
    import torch

    if requested is not None:
        threads, why = check_threads(int(requested)), f"{requested} (as asked, --threads)"
    elif on_cpu:
        threads, why = threads_for_load()
        processes = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
        if processes > 1:  # torchrun's ranks on this machine split the idle CPUs
            threads = max(1, threads // processes)
            why = f"{threads} per process ({processes} processes here, {why.split(' (', 1)[1]}"
    else:
        return torch.get_num_threads(), None
    torch.set_num_threads(threads)
    return threads, f"threads: {why}"


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
