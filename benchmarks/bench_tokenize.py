"""Benchmark `draftsmith tokenize`: samples/s on this machine, against a simple baseline run here.

The baseline is what a quick script would do in one process: render each conversation, tokenize
it, mask everything after the tokenized generation prompt, write one Parquet file at the end (no
offset mapping, no empty-think handling, no verification). `tokenize_dataset` does more work per
row (exact spans, decode verification, atomic shards), so the ratio shows what the parallel
streaming pipeline buys back, and what verification costs.

    PYTHONPATH=src python benchmarks/bench_tokenize.py --rows 4000
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq


def baseline(source: Path, tokenizer_dir: Path, out: Path) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    ids, input_ids, loss_masks = [], [], []
    with source.open() as handle:
        for line in handle:
            row = json.loads(line)
            messages = row["messages"]
            text = tokenizer.apply_chat_template(messages, tokenize=False)
            prompt = tokenizer.apply_chat_template(messages[:-1], tokenize=False, add_generation_prompt=True)
            tokens = tokenizer(text, add_special_tokens=False)["input_ids"]
            prompt_length = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
            ids.append(row["id"])
            input_ids.append(tokens)
            loss_masks.append([0] * prompt_length + [1] * (len(tokens) - prompt_length))
    table = pa.table(
        {
            "id": ids,
            "input_ids": pa.array(input_ids, type=pa.list_(pa.int32())),
            "loss_mask": pa.array(loss_masks, type=pa.list_(pa.int8())),
        }
    )
    pq.write_table(table, out / "part-00000.parquet")
    return len(ids)


def cpu_seconds() -> float:
    """CPU time of this process and of its finished children (the pool workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    from draftsmith.tiny import build_tiny_target, synthetic_conversations
    from draftsmith.tokenize import TokenizeOptions, tokenize_dataset

    tokenizer_dir = build_tiny_target()
    with tempfile.TemporaryDirectory(prefix="bench-tokenize-") as scratch:
        root = Path(scratch)
        source = root / "rows.jsonl"
        with source.open("w") as handle:
            for row in synthetic_conversations(args.rows, seed=123):
                handle.write(json.dumps(row) + "\n")

        def run_baseline() -> tuple[float, float]:
            out = Path(tempfile.mkdtemp(dir=root))
            started, cpu = time.perf_counter(), cpu_seconds()
            count = baseline(source, tokenizer_dir, out)
            return count / (time.perf_counter() - started), count / (cpu_seconds() - cpu)

        def run_pipeline(settings: dict) -> tuple[float, float]:
            options = TokenizeOptions(progress=False, overwrite=True, **settings)
            started, cpu = time.perf_counter(), cpu_seconds()
            summary = tokenize_dataset(source, tokenizer_dir, root / "out", options)
            elapsed = time.perf_counter() - started
            assert summary.written == args.rows, summary.verdict()
            return summary.input_rows / elapsed, summary.input_rows / (cpu_seconds() - cpu)

        runs = [
            ("baseline: 1 process, naive prefix mask", run_baseline),
            (f"tokenize_dataset: {args.workers} workers, verify all",
             lambda: run_pipeline(dict(workers=args.workers, verify_share=1.0))),
            (f"tokenize_dataset: {args.workers} workers, verify 5%",
             lambda: run_pipeline(dict(workers=args.workers, verify_share=0.05))),
            ("tokenize_dataset: 1 worker, verify all", lambda: run_pipeline(dict(workers=1, verify_share=1.0))),
        ]
        # Interleaved repeats, best of each: the machine is shared, and the best run is the one
        # least disturbed by other processes.
        best: dict[str, tuple[float, float]] = {}
        for _ in range(args.repeats):
            for label, run in runs:
                rate, per_cpu = run()
                previous = best.get(label, (0.0, 0.0))
                best[label] = (max(previous[0], rate), max(previous[1], per_cpu))
        results = [(label, *best[label]) for label, _ in runs]

    base, base_cpu = results[0][1], results[0][2]
    print(
        f"tokenize benchmark: {args.rows} synthetic conversations, tiny target tokenizer, "
        f"{os.cpu_count()} CPUs, best of {args.repeats}, load average {os.getloadavg()[0]:.1f}"
    )
    print("  (wall-clock samples/s; samples per CPU-second of all processes, robust to a busy machine)")
    for label, rate, per_cpu in results:
        print(
            f"  {label:<46} {rate:7.0f} samples/s  x{rate / base:.2f}   "
            f"{per_cpu:7.0f} samples/cpu-s  x{per_cpu / base_cpu:.2f}"
        )


if __name__ == "__main__":
    main()
