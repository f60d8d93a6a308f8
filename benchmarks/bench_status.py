"""Benchmark: `draftsmith status` of a 914,000-row generate directory (issue 26: under 5 s, 500 MB).

Builds the directory with generate's own writer (`OutputStore`: row parts, failures file and the
progress record, exactly as a run writes them) in a temporary directory: several earlier runs (one
part each, closed) and a live last run whose rows after its last progress record are a tail that
status must parse. The benchmark holds the shard's lock while it measures, as the live writer would.
Rows are contract-1 rows with short texts (the status reads their lengths, not their texts) and
output lengths drawn around a 3,100-token mean, so the directory is ~0.4 GB rather than ~30 GB (status never reads the texts).

It runs `python -m draftsmith status DIR --json` in a fresh process (`--repeat` times) and prints
wall time, CPU time (user + system of the child: what a loaded machine does not inflate) and peak
RSS (the child's VmHWM, polled, as bench_scale.py does), then the same with the progress record
moved away (the fallback that parses every row: the baseline) and the ratio.

    PYTHONPATH=src python benchmarks/bench_status.py            # 914,000 rows
    PYTHONPATH=src python benchmarks/bench_status.py --rows 100000 --no-baseline
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from bench_scale import measure

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

from draftsmith.core.lock import lock_directory  # noqa: E402
from draftsmith.data.generated import generated_row  # noqa: E402
from draftsmith.generate.store import OutputStore  # noqa: E402


def _rows(first: int, count: int, rng: np.random.Generator, max_tokens: int):
    lengths = np.minimum(rng.lognormal(np.log(2800), 0.45, count).astype(int) + 1, max_tokens)
    for index, tokens in enumerate(lengths):
        sample = first + index
        reasoning = int(tokens * 0.7)
        yield generated_row(
            f"bench-{sample:07d}", [{"role": "user", "content": f"Question number {sample}: explain the result."}],
            f"The answer to question {sample} is {sample % 97}.", f"Let me think about question {sample}.",
            finish_reason="length" if tokens >= max_tokens else "stop", prompt_tokens=40, completion_tokens=int(tokens),
            reasoning_tokens=reasoning, model="bench-model", endpoint="http://10.0.0.1:8000", latency_s=12.5,
        )  # fmt: skip


def build(directory: Path, rows: int, total: int, runs: int, tail: int, max_tokens: int = 8192) -> OutputStore:
    """`runs` closed runs, then a live run whose last `tail` rows follow its last progress record."""
    rng = np.random.default_rng(0)
    settings = {"model": "bench-model", "shard_count": 1, "max_tokens": max_tokens, "temperature": 0.6, "top_p": 0.95,
                "seed": None, "chat_template_kwargs": {"enable_thinking": True}, "extra_body": {},
                "endpoints": ["http://10.0.0.1:8000"], "concurrency": 64}  # fmt: skip
    (directory / "manifest.json").write_text(json.dumps({"stage": "generate", "settings": settings}))
    done, per_run = 0, (rows - tail) // runs
    for run in range(runs + 1):
        live = run == runs
        count = rows - done if live else per_run
        # The live run records once (at its first row) and not again within the benchmark: the rest is tail.
        store = OutputStore(directory, progress_interval_s=3600 if live else 5.0)
        store.progress.begin(input=total, already_done=done, todo=total - done, settings=settings)
        for index, row in enumerate(_rows(done, count, rng, max_tokens)):
            if index % 500 == 499:  # 0.2% of samples fail for good (HTTP 503 after retries, timeouts)
                reason = "gave up after 6 attempts, last: HTTP 503: overloaded" if index % 1000 else "request timed out"
                store.write_failure(f"failed-{done + index}", reason, 6, "http://10.0.0.1:8000")
            store.write_row(row)
        done += count
        if live:
            store.flush()
            return store
        store.close()
    raise AssertionError("unreachable")


def timed(command: list[str]) -> dict:
    """`measure` plus the child's CPU seconds (it is reaped inside, so RUSAGE_CHILDREN counts it)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = measure(command)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    result["cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=914_000)
    parser.add_argument("--total", type=int, default=1_000_000, help="samples in the job")
    parser.add_argument("--runs", type=int, default=6, help="earlier (resumed) runs, one row part each")
    parser.add_argument("--tail", type=int, default=20_000, help="rows of the live run past its last progress record")
    parser.add_argument("--repeat", type=int, default=3, help="status runs on the directory (each figure printed)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the full-parse baseline")
    parser.add_argument("--work-dir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-status-", dir=args.work_dir) as work:
        directory = Path(work) / "gen"
        started = time.perf_counter()
        with lock_directory(directory, "generate shard 0/1", lock_file=directory / ".draftsmith.s0of1.lock"):
            store = build(directory, args.rows, args.total, args.runs, args.tail)
            size = sum(path.stat().st_size for path in directory.glob("generated-*.jsonl"))
            print(f"wrote {args.rows:,} rows ({size / 1e9:.2f} GB, {args.runs + 1} parts, a {args.tail:,}-row tail) "
                  f"in {time.perf_counter() - started:.0f}s", file=sys.stderr)  # fmt: skip
            command = [sys.executable, "-m", "draftsmith", "status", str(directory), "--json"]
            for _ in range(args.repeat):
                fast = timed(command)
                view = json.loads(fast["stdout"])
                assert view["done"] == args.rows and view["state"] == "running", (view["done"], view["state"])
                print(f"status ({args.rows:,} rows, progress record + tails): {fast['wall_s']:.2f} s wall, "
                      f"{fast['cpu_s']:.2f} s CPU, peak RSS {fast['peak_rss_gb'] * 1000:.0f} MB; done {view['done']:,} / "
                      f"{view['total']:,}, p50 {view['lengths']['p50']:,.0f} p90 {view['lengths']['p90']:,.0f} tokens")  # fmt: skip
            if not args.no_baseline:
                record = directory / "progress-s0of1.json"
                record.rename(directory / "progress.moved")
                slow = timed(command)
                record.parent.joinpath("progress.moved").rename(record)
                assert json.loads(slow["stdout"])["done"] == args.rows
                print(f"baseline (no progress record: every row parsed): {slow['wall_s']:.2f} s wall, {slow['cpu_s']:.2f} s CPU, "
                      f"peak RSS {slow['peak_rss_gb'] * 1000:.0f} MB; the record + tails use "
                      f"{slow['cpu_s'] / fast['cpu_s']:.1f}x less CPU")  # fmt: skip
            store.close()


if __name__ == "__main__":
    main()
