"""Benchmark: the demo's drafter training on a machine loaded to 2x its cores, with torch's default
threads (every core, what `train` and `demo` used before) against the load-aware default
(`draftsmith.core.limits.choose_threads`: one thread per CPU the 1-minute load leaves idle).

It starts 2 x CPUs busy-looping processes itself (and stops them at the end), waits until the
1-minute load average shows them (or `--settle-s` passes), then trains the demo's drafter shape
(tiny target, block 16, 1 draft layer, batch 4, lr 5e-3, answers of about the demo's length) for
`--steps` steps with each default, alternately, `--rounds` times, and prints the output tok/s of
each (the best round of each) and their ratio.

    PYTHONPATH=src python benchmarks/bench_threads.py [--steps 6] [--rounds 2] [--load-factor 2]

The load it adds is on top of whatever else runs on the machine: the printed load is what the
thread choice saw.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import sys
import tempfile
import time
from pathlib import Path


def _spin(stop) -> None:
    while not stop.is_set():
        for _ in range(100_000):
            pass


def _rows(vocab: int, count: int, prompt: int, answer: int, seed: int = 0) -> list[dict]:
    generator = random.Random(seed)
    rows = []
    for index in range(count):
        ids = [generator.randrange(4, vocab) for _ in range(prompt + answer)]
        rows.append({"id": f"r{index}", "input_ids": ids, "loss_mask": [0] * prompt + [1] * answer,
                     "finish_reason": "stop"})
    return rows


def _train(target: Path, data: Path, out: Path, steps: int, threads: int | None) -> float:
    import contextlib

    from draftsmith.train import TrainConfig, train_drafter

    config = TrainConfig(target=target, data=data, out=out, block_size=16, num_draft_layers=1, max_steps=steps,
                         epochs=1000, batch_size=4, lr=5e-3, seed=0, progress=False, log_every=steps,
                         num_threads=threads)
    with contextlib.redirect_stdout(sys.stderr):
        return train_drafter(config).tokens_per_s


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per measurement (the demo runs 240)")
    parser.add_argument("--rounds", type=int, default=2, help="measurements of each default, alternating")
    parser.add_argument("--load-factor", type=float, default=2.0, help="busy processes per CPU to start")
    parser.add_argument("--settle-s", type=float, default=75.0, help="most seconds to wait for the load average")
    args = parser.parse_args()

    import torch

    from draftsmith.core.limits import usable_cpus
    from draftsmith.data.tokenized import write_tokenized
    from draftsmith.tiny import TinyTargetSpec, build_tiny_target

    torch_default = torch.get_num_threads()  # what an unset --threads meant before: torch's own choice
    cpus = usable_cpus()
    work = Path(tempfile.mkdtemp(prefix="bench-threads-"))
    # The tiny target's shape, barely trained: a step costs what it costs on the trained one.
    spec = TinyTargetSpec(train_steps=1)
    target = build_tiny_target(work / "target", spec=spec, log=lambda message: None)
    vocab = spec.vocab_size
    data = work / "tokenized"
    write_tokenized(_rows(vocab, 64, prompt=24, answer=192), data)  # the demo: 192 output tokens per sample

    stop = multiprocessing.Event()
    spinners = [multiprocessing.Process(target=_spin, args=(stop,), daemon=True)
                for _ in range(int(round(args.load_factor * cpus)))]
    for process in spinners:
        process.start()
    try:
        began = time.monotonic()
        while os.getloadavg()[0] < args.load_factor * cpus and time.monotonic() - began < args.settle_s:
            time.sleep(1)
        print(f"{cpus} CPUs, {len(spinners)} busy processes started; 1-minute load {os.getloadavg()[0]:.1f} "
              f"after {time.monotonic() - began:.0f}s; torch's default threads {torch_default}")
        rates: dict[str, list[float]] = {"torch default": [], "load-aware": []}
        for round_number in range(args.rounds):
            for name, threads in (("torch default", torch_default), ("load-aware", None)):
                out = work / f"train-{round_number}-{name.replace(' ', '-')}"
                rate = _train(target, data, out, args.steps, threads)
                rates[name].append(rate)
                print(f"  round {round_number + 1} {name:13s} ({torch.get_num_threads()} threads, load "
                      f"{os.getloadavg()[0]:.1f}): {rate:,.1f} tok/s", flush=True)
    finally:
        stop.set()
        for process in spinners:
            process.join(timeout=5)
            if process.is_alive():
                process.terminate()
    old, new = max(rates["torch default"]), max(rates["load-aware"])
    print(f"torch default ({torch_default} threads): {old:,.1f} tok/s; load-aware: {new:,.1f} tok/s; "
          f"ratio {new / old:.2f}x ({args.steps} steps of batch 4, best of {args.rounds})")


if __name__ == "__main__":
    main()
