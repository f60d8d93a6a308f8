"""Worker counts bounded by the work and the CPUs; the one row-size limit and its override."""

from __future__ import annotations

import os

import pytest

from draftsmith.core.errors import InputError
from draftsmith.core.limits import DEFAULT_MAX_ROW_BYTES, max_row_bytes, workers_for


def test_workers_are_bounded_by_the_work_and_for_cpu_bound_work_by_the_cpus():
    assert workers_for(10**9, 4) == 4
    assert workers_for(3, 100) == 3
    assert workers_for(32, 0) == 1  # nothing to do still gets one worker to find that out
    assert workers_for(0, 100, at_least=0) == 0  # "no data workers" stays none
    assert workers_for(10**6, None, cpu_bound=True) == len(os.sched_getaffinity(0))


def test_the_row_size_limit_defaults_to_64_mib_and_the_environment_sets_it(monkeypatch):
    monkeypatch.delenv("DRAFTSMITH_MAX_ROW_BYTES", raising=False)
    assert max_row_bytes() == DEFAULT_MAX_ROW_BYTES == 64 * 1024 * 1024
    assert max_row_bytes(1000) == 1000
    monkeypatch.setenv("DRAFTSMITH_MAX_ROW_BYTES", "1e6")
    assert max_row_bytes() == 1_000_000
    monkeypatch.setenv("DRAFTSMITH_MAX_ROW_BYTES", "lots")
    with pytest.raises(InputError, match="DRAFTSMITH_MAX_ROW_BYTES='lots'"):
        max_row_bytes()


def test_the_default_thread_count_leaves_busy_cpus_to_their_load():
    from draftsmith.core.limits import threads_for_load

    assert threads_for_load(cpus=2, load=0.1)[0] == 2  # an idle machine: every CPU
    assert threads_for_load(cpus=2, load=1.0)[0] == 1  # one busy process: the idle one
    assert threads_for_load(cpus=2, load=7.5)[0] == 1  # never below one
    assert threads_for_load(cpus=16, load=4.2)[0] == 12
    threads, why = threads_for_load(cpus=2, load=1.7)
    assert threads == 1 and "2 CPUs, 1-minute load 1.7" in why and "--threads" in why
    assert 1 <= threads_for_load()[0] <= len(os.sched_getaffinity(0))  # this machine, as it is now
