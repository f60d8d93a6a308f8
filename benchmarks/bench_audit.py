"""Benchmark: `audit_tokenized` on 1,000,000 synthetic tokenized samples vs a naive per-row loop.

Builds a contract-2 dataset (Parquet shards) in a temp dir with the tiny target's chat layout
(`<|im_start|>user\\n ... <|im_end|>\\n<|im_start|>assistant\\n<think>\\n ... \\n</think>\\n\\n
... <|im_end|>\\n`, loss mask on the answer), audits it with the tiny tokenizer, and runs a
straightforward pure-Python audit of the same checks on a subset in the same process.

    PYTHONPATH=src python benchmarks/bench_audit.py [--rows 1000000] [--naive-rows 20000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def build_dataset(tokenizer, out: Path, rows: int, shard_rows: int, seed: int = 0) -> int:
    encode = lambda text: np.asarray(tokenizer(text, add_special_tokens=False)["input_ids"], np.int32)  # noqa
    fixed = [
        encode("<|im_start|>user\n"),
        None,  # prompt
        encode("<|im_end|>\n<|im_start|>assistant\n"),
        encode("<think>\n"),
        None,  # reasoning
        encode("\n</think>\n\n"),
        None,  # answer
        encode("<|im_end|>"),
        encode("\n"),
    ]
    first_trained, last_trained = 3, 7  # segments covered by the loss mask
    special = set(tokenizer.all_special_ids) | {tokenizer.convert_tokens_to_ids(t) for t in ("<think>", "</think>")}
    content = np.asarray([i for i in range(len(tokenizer)) if i not in special], np.int32)
    rng = np.random.default_rng(seed)
    total_tokens = 0
    out.mkdir(parents=True, exist_ok=True)
    for shard, start in enumerate(range(0, rows, shard_rows)):
        n = min(shard_rows, rows - start)
        lengths = np.empty((n, len(fixed)), np.int64)
        random_lengths = {1: (20, 120), 4: (20, 200), 6: (5, 120)}
        for k, piece in enumerate(fixed):
            lengths[:, k] = len(piece) if piece is not None else rng.integers(*random_lengths[k], size=n)
        # 2% stock replies, so the dominant-span path has something to find.
        stock = rng.random(n) < 0.02
        lengths[stock, 4] = 0
        lengths[stock, 6] = 2
        seg_starts = np.zeros(lengths.size, np.int64)
        np.cumsum(lengths.ravel()[:-1], out=seg_starts[1:])
        seg_starts = seg_starts.reshape(n, len(fixed))
        row_lengths = lengths.sum(1)
        flat = content[rng.integers(0, len(content), size=int(row_lengths.sum()))]
        for k, piece in enumerate(fixed):
            if piece is not None:
                flat[(seg_starts[:, k, None] + np.arange(len(piece))).ravel()] = np.tile(piece, n)
        stock_positions = seg_starts[stock, 6, None] + np.arange(2)
        flat[stock_positions.ravel()] = np.tile(content[:2], int(stock.sum()))
        delta = np.zeros(len(flat) + 1, np.int8)
        np.add.at(delta, seg_starts[:, first_trained], 1)
        np.add.at(delta, seg_starts[:, last_trained] + lengths[:, last_trained], -1)
        mask = np.cumsum(delta[:-1], dtype=np.int8)
        offsets = np.zeros(n + 1, np.int32)
        np.cumsum(row_lengths, out=offsets[1:])
        table = pa.table(
            {
                "id": pa.array([f"bench-{start + i:07d}" for i in range(n)]),
                "input_ids": pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat)),
                "loss_mask": pa.ListArray.from_arrays(pa.array(offsets), pa.array(mask)),
                "num_tokens": pa.array(row_lengths.astype(np.int32)),
                "num_trainable": pa.array(
                    np.add.reduceat(mask.astype(np.int64), offsets[:-1]).astype(np.int32)
                ),
                "finish_reason": pa.array(["stop"] * n),
            }
        )
        pq.write_table(table, out / f"part-{shard:05d}.parquet", compression="zstd")
        total_tokens += int(row_lengths.sum())
    return total_tokens


def naive_audit(directory: Path, info, limit: int) -> dict:
    """The obvious implementation: Python loops over rows and tokens, same checks."""
    header = info.assistant_header.tolist()
    eot = set(info.end_of_turn_ids.tolist())
    trivial, scaffolding = info.trivial, info.scaffolding
    sums, spans, prompts = Counter(), Counter(), Counter()
    counts = Counter()
    seen = 0
    for file in sorted(directory.glob("*.parquet")):
        for batch in pq.ParquetFile(file).iter_batches(batch_size=8192, columns=["id", "input_ids", "loss_mask"]):
            for ids, mask in zip(batch.column("input_ids").to_pylist(), batch.column("loss_mask").to_pylist()):
                if seen >= limit:
                    return {"samples": seen, "sums": sums, "spans": spans, "counts": counts}
                seen += 1
                if len(ids) != len(mask):
                    counts["length_mismatch"] += 1
                    continue
                span = tuple(t for t, m in zip(ids, mask) if m)
                prompt = tuple(t for t, m in zip(ids, mask) if not m)
                sums[len(span)] += 1
                spans[hash(span)] += 1
                prompts[hash(prompt)] += 1
                if not any(not trivial[t] for t in span):
                    counts["empty_response"] += 1
                if span and span[-1] not in eot:
                    counts["missing_end_of_turn"] += 1
                in_header = [False] * len(ids)
                last_header = -1
                for p in range(len(ids) - len(header) + 1):
                    if ids[p : p + len(header)] == header:
                        last_header = p
                        for q in range(p, p + len(header)):
                            in_header[q] = True
                if any(m and (in_header[p] or scaffolding[t]) for p, (t, m) in enumerate(zip(ids, mask))):
                    counts["scaffolding_masked"] += 1
                if last_header >= 0 and any(mask[p] for p in range(last_header)):
                    counts["prompt_masked"] += 1
                if info.think_open in ids:
                    start = len(ids) - 1 - ids[::-1].index(info.think_open)
                    if info.think_close in ids[start:]:
                        end = start + ids[start:].index(info.think_close)
                        if all(trivial[t] for t in ids[start + 1 : end]):
                            counts["empty_thinking"] += 1
    return {"samples": seen, "sums": sums, "spans": spans, "counts": counts}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--naive-rows", type=int, default=20_000)
    parser.add_argument("--shard-rows", type=int, default=100_000)
    parser.add_argument("--no-tokenizer-run", action="store_true", help="skip the run without a tokenizer")
    args = parser.parse_args()

    from transformers import AutoTokenizer

    from draftsmith.audit import audit_tokenized
    from draftsmith.audit.tokens import describe_tokenizer
    from draftsmith.tiny import build_tiny_target

    target = build_tiny_target()
    tokenizer = AutoTokenizer.from_pretrained(target)
    with tempfile.TemporaryDirectory(prefix="bench-audit-") as tmp:
        directory = Path(tmp) / "tokenized"
        started = time.perf_counter()
        tokens = build_dataset(tokenizer, directory, args.rows, args.shard_rows)
        size = sum(f.stat().st_size for f in directory.glob("*.parquet"))
        print(
            f"built {args.rows:,} rows, {tokens:,} tokens ({tokens / args.rows:.0f}/row), "
            f"{size / 2**20:.0f} MiB Parquet in {time.perf_counter() - started:.1f}s"
        )

        # Wall time on a shared machine includes other processes' CPU use; process CPU time is
        # what this audit itself costs. Both are printed; ratios use CPU time.
        def timed(function):
            wall, cpu = time.perf_counter(), time.process_time()
            result = function()
            return result, time.perf_counter() - wall, time.process_time() - cpu

        report, fast_wall, fast_cpu = timed(lambda: audit_tokenized(directory, tokenizer=tokenizer))
        print(
            f"audit_tokenized (with tokenizer): {report.samples:,} samples in {fast_wall:.1f}s wall / "
            f"{fast_cpu:.1f}s CPU = {report.samples / fast_wall:,.0f} samples/s wall, "
            f"{report.samples / fast_cpu:,.0f} samples/s CPU, {tokens / fast_cpu / 1e6:.1f}M tokens/s CPU"
        )
        print(f"  verdict: {report.verdict}")
        if not args.no_tokenizer_run:
            bare, wall, cpu = timed(lambda: audit_tokenized(directory))
            print(
                f"audit_tokenized (no tokenizer):   {bare.samples / wall:,.0f} samples/s wall "
                f"({wall:.1f}s), {bare.samples / cpu:,.0f} samples/s CPU ({cpu:.1f}s)"
            )

        info = describe_tokenizer(tokenizer)
        naive, naive_wall, naive_cpu = timed(lambda: naive_audit(directory, info, args.naive_rows))
        print(
            f"naive per-row Python on {naive['samples']:,} rows: {naive['samples'] / naive_wall:,.0f} samples/s "
            f"wall, {naive['samples'] / naive_cpu:,.0f} samples/s CPU"
        )
        fast_rate, naive_rate = report.samples / fast_cpu, naive["samples"] / naive_cpu
        print(f"speed-up (CPU time): {fast_rate / naive_rate:.0f}x")

        first = pq.read_table(sorted(directory.glob("*.parquet"))[0]).slice(0, naive["samples"])
        check_dir = Path(tmp) / "subset"
        check_dir.mkdir()
        pq.write_table(first, check_dir / "part-00000.parquet")
        check = audit_tokenized(check_dir, tokenizer=tokenizer).to_dict()
        agree = all(
            check["checks"][name]["count"] == naive["counts"][name]
            for name in ("empty_response", "missing_end_of_turn", "scaffolding_masked", "prompt_masked", "empty_thinking")
        ) and check["dominant"]["mask_sum"]["count"] == naive["sums"].most_common(1)[0][1] and (
            check["dominant"]["span"]["count"] == naive["spans"].most_common(1)[0][1]
        )
        print(f"vectorised and naive results agree on the subset: {agree}")


if __name__ == "__main__":
    main()
