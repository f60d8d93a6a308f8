"""`draftsmith bench`: measure one endpoint's throughput across concurrency and find the knee.

Public API: ``BenchConfig``, ``run_bench(config) -> BenchResult`` (``arun_bench`` async),
``BenchResult.to_dict()`` / ``.save(path)`` (contract 3 JSON), ``find_knee``, ``load_bench``.
"""

from draftsmith.bench.sweep import (
    DEFAULT_CONCURRENCIES,
    BenchConfig,
    BenchResult,
    LevelResult,
    arun_bench,
    find_knee,
    load_bench,
    percentile,
    run_bench,
)

__all__ = [
    "DEFAULT_CONCURRENCIES",
    "BenchConfig",
    "BenchResult",
    "LevelResult",
    "arun_bench",
    "find_knee",
    "load_bench",
    "percentile",
    "run_bench",
]
