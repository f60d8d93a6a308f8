"""Benchmark: does training start-up and memory grow with the sample count? (issue 15)

Writes synthetic tokenized sets of N and of a baseline N0 samples (~2,700-token rows, the seed's
shape: a ~300-token prompt, the rest trained), then, for each, in fresh subprocesses:

- `load_tokenized` alone (+ len, total_tokens, total_trainable, fingerprint, trainable_pairs);
- `draftsmith train` for a few steps on the tiny target (built once by `build_tiny_target`, cached),
  with the DFlash drafter or (`--drafter dspark`) DSpark's.

It prints wall time, start-up time (until the trainer prints its "training a ..." line, i.e. data
and target loaded) and peak RSS of each subprocess (its own VmHWM, polled; shared pages counted once per process), the growth from N0 to
N and the per-sample slope. Small N by default; the issue's check, for the README:

    PYTHONPATH=src python benchmarks/bench_scale.py --samples 200000 --baseline 20000

(about 3 GB of disk under --work-dir for 220k rows; the sets are kept there for reruns.)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

SRC = Path(__file__).resolve().parents[1] / "src"
VOCAB = 1000  # token ids below this: inside the tiny target's (and any real target's) vocabulary
LOAD_ONLY = """
import json, sys, time
t0 = time.perf_counter()
from draftsmith.data.tokenized import load_tokenized
imported = time.perf_counter()
dataset = load_tokenized(sys.argv[1])
loaded = time.perf_counter()
facts = [len(dataset), dataset.total_tokens, dataset.total_trainable, dataset.fingerprint()]
aggregated = time.perf_counter()
usable = int((dataset.trainable_pairs() > 0).sum())
scanned = time.perf_counter()
print(json.dumps({"samples": facts[0], "tokens": facts[1], "load_s": loaded - imported,
                  "aggregates_s": aggregated - loaded, "trainable_pairs_s": scanned - aggregated, "usable": usable}))
"""


def write_set(out: Path, samples: int, mean_tokens: int, vocab: int, seed: int = 0) -> Path:
    """`samples` rows of mean_tokens +- 10% tokens (prompt ~11%, untrained), 10,000 rows per shard."""
    from draftsmith.data.tokenized import ShardWriter, load_tokenized

    if (out / "done").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    writer = ShardWriter(out, rows_per_shard=10_000)
    started = time.perf_counter()
    for first in range(0, samples, 10_000):
        count = min(10_000, samples - first)
        lengths = rng.integers(int(mean_tokens * 0.9), int(mean_tokens * 1.1) + 1, count)
        tokens = rng.integers(0, vocab, int(lengths.sum()), dtype=np.int32)
        position = 0
        for index, length in enumerate(lengths):
            prompt = length // 9
            mask = np.ones(length, dtype=np.int8)
            mask[:prompt] = 0
            writer.add(f"bench-{first + index}", tokens[position : position + length], mask)
            position += length
    writer.flush()
    (out / "done").write_text(str(samples))
    size = sum(path.stat().st_size for path in out.glob("part-*")) / 1e9
    assert len(load_tokenized(out)) == samples
    print(f"wrote {samples:,} samples ({size:.2f} GB) in {time.perf_counter() - started:.0f}s to {out}", file=sys.stderr)
    return out


def _status_kb(pid: int, field: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def _descendants(pid: int) -> list[int]:
    found, frontier = [], [pid]
    while frontier:
        parent = frontier.pop()
        try:
            tasks = os.listdir(f"/proc/{parent}/task")
        except OSError:
            continue
        for task in tasks:
            try:
                with open(f"/proc/{parent}/task/{task}/children") as handle:
                    children = [int(value) for value in handle.read().split()]
            except OSError:
                children = []
            found += children
            frontier += children
    return found


def measure(command: list[str], marker: str | None = None) -> dict:
    """Run `command`; its wall time, time until `marker` first appears on stderr, peak RSS, stdout.

    Peak RSS is the process's own high-water mark (`VmHWM` in /proc, polled every 20 ms): the
    `wait4` rusage would not do, since Linux carries the parent's RSS across fork+exec into the
    child's `ru_maxrss` (every run then reads as at least this script's own size). The largest sum
    of VmRSS over the process and its children (DataLoader workers) is reported beside it.
    """
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    seen: dict[str, float] = {"hwm_kb": 0, "tree_kb": 0}
    lines: list[str] = []
    done = threading.Event()

    def read_stderr():
        for line in process.stderr:
            lines.append(line)
            if marker and marker in line and "marker" not in seen:
                seen["marker"] = time.perf_counter() - started

    def poll_memory():
        while not done.is_set():
            seen["hwm_kb"] = max(seen["hwm_kb"], _status_kb(process.pid, "VmHWM"))
            tree = sum(_status_kb(pid, "VmRSS") for pid in [process.pid, *_descendants(process.pid)])
            seen["tree_kb"] = max(seen["tree_kb"], tree)
            done.wait(0.02)

    threads = [threading.Thread(target=read_stderr, daemon=True), threading.Thread(target=poll_memory, daemon=True)]
    for thread in threads:
        thread.start()
    stdout = process.stdout.read()
    process.wait()
    done.set()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    if process.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({process.returncode}):\n{''.join(lines[-20:])}")
    return {"wall_s": wall, "startup_s": seen.get("marker"), "peak_rss_gb": seen["hwm_kb"] * 1024 / 1e9,
            "tree_rss_gb": seen["tree_kb"] * 1024 / 1e9, "stdout": stdout}  # fmt: skip


def run_one(data: Path, target: Path | None, work: Path, steps: int, drafter: str = "dflash") -> dict:
    load = measure([sys.executable, "-c", LOAD_ONLY, str(data)])
    if target is None:
        return {"load": {**load, **json.loads(load.pop("stdout"))}}
    out = Path(tempfile.mkdtemp(prefix="train-", dir=work))
    train = measure(
        [sys.executable, "-m", "draftsmith", "train", "--target", str(target), "--data", str(data), "--out", str(out),
         "--max-steps", str(steps), "--draft-layers", "1", "--block-size", "4", "--num-anchors", "8",
         "--threads", "1", "--no-progress", "--log-every", "1", "--drafter", drafter],
        marker="training a ",
    )  # fmt: skip
    return {"load": {**load, **json.loads(load.pop("stdout"))}, "train": train}


def report(results: dict[int, dict]) -> None:
    (small, base), (large, big) = sorted(results.items())
    trained = "train" in base
    rows = [
        ("load_tokenized: peak RSS (GB)", base["load"]["peak_rss_gb"], big["load"]["peak_rss_gb"]),
        ("load_tokenized: load (s)", base["load"]["load_s"], big["load"]["load_s"]),
        ("load_tokenized: aggregates + fingerprint (s)", base["load"]["aggregates_s"], big["load"]["aggregates_s"]),
        ("load_tokenized: trainable_pairs scan (s)", base["load"]["trainable_pairs_s"], big["load"]["trainable_pairs_s"]),
    ]
    if trained:
        rows += [
        ("train: start-up to first-step line (s)", base["train"]["startup_s"], big["train"]["startup_s"]),
        ("train: wall (s)", base["train"]["wall_s"], big["train"]["wall_s"]),
        ("train: peak RSS (GB)", base["train"]["peak_rss_gb"], big["train"]["peak_rss_gb"]),
        ("train: peak RSS with loader workers (GB)", base["train"]["tree_rss_gb"], big["train"]["tree_rss_gb"]),
        ]  # fmt: skip
    print(f"{'':46} {small:>12,} {large:>12,} {'growth':>9} {'ratio':>6} {'per sample':>12}")
    for name, a, b in rows:
        slope = (b - a) / (large - small)
        unit = f"{slope * 1e9:,.0f} B" if "GB" in name else f"{slope * 1e6:,.2f} us"
        print(f"{name:46} {a:12.3f} {b:12.3f} {b - a:+9.3f} {b / a if a else float('nan'):6.2f} {unit:>12}")
    if not trained:
        return
    growth = big["train"]["peak_rss_gb"] - base["train"]["peak_rss_gb"]
    print(f"train peak RSS grows {growth:+.3f} GB from {small:,} to {large:,} samples "
          f"({'within' if growth < 0.5 else 'OVER'} issue 15's 0.5 GB)")  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4_000, help="N (the issue's check: 200000)")
    parser.add_argument("--baseline", type=int, default=400, help="N0, measured in the same run (the issue's: 20000)")
    parser.add_argument("--tokens", type=int, default=2_700, help="mean tokens per row")
    parser.add_argument("--steps", type=int, default=2, help="train steps per run")
    parser.add_argument("--load-only", action="store_true", help="measure load_tokenized only (no target needed)")
    parser.add_argument("--drafter", choices=("dflash", "dspark"), default="dflash",
                        help="the drafter `train` builds (dspark: its Markov and confidence heads too)")
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "draftsmith-bench-scale")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(SRC))
    args.work_dir.mkdir(parents=True, exist_ok=True)
    sets = {samples: write_set(args.work_dir / f"tokenized-{samples}x{args.tokens}", samples, args.tokens, VOCAB)
            for samples in (args.baseline, args.samples)}  # fmt: skip
    target = None
    if not args.load_only:
        from draftsmith.tiny import build_tiny_target

        target = build_tiny_target(log=lambda message: print(message, file=sys.stderr))
    results = {}
    for samples, data in sets.items():
        results[samples] = run_one(data, target, args.work_dir, args.steps, args.drafter)
        print(f"{samples:,} samples: {json.dumps(results[samples])}", file=sys.stderr)
    report(results)


if __name__ == "__main__":
    main()
