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
