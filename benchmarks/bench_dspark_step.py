"""Benchmark: a DSpark training step against a DFlash step of the same depth, on the CPU, in one process.

Both trainers get the same target, data, micro-batch, anchors and depth; the step is the forward and
backward of one micro-batch (online: the target forward included, as in training). The two are timed
interleaved, best of `--repeats`, and the ratio DSpark / DFlash is printed (issue 31 asks for <= 1.3).

    PYTHONPATH=src python benchmarks/bench_dspark_step.py [--layers 1 2] [--markov-rank 256] [--target DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scale import write_set  # noqa: E402

from draftsmith.train import TrainConfig, load_tokenized  # noqa: E402
from draftsmith.train.distributed import init_distributed  # noqa: E402
from draftsmith.train.trainer import DrafterTrainer  # noqa: E402


def _trainer(target: Path, data: Path, layers: int, block: int, anchors: int, **extra) -> DrafterTrainer:
    config = TrainConfig(target=target, data=data, out=Path(tempfile.mkdtemp()), block_size=block, num_draft_layers=layers,
                         num_anchors=anchors, batch_size=2, dtype="fp32", device="cpu", progress=False, **extra)  # fmt: skip
    return DrafterTrainer(config, init_distributed("cpu"), load_tokenized(data))


def _step(trainer: DrafterTrainer, samples: list[int]) -> float:
    trainer.drafter.zero_grad(set_to_none=True)
    started = time.perf_counter()
    output, _ = trainer.forward_loss(trainer.drafter, samples, 0)
    output.loss.backward()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", type=Path, default=None, help="target directory (default: the tiny target)")
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--block-size", type=int, default=8, help="DSpark drafts B per block; DFlash B-1")
    parser.add_argument("--markov-rank", type=int, default=256)
    parser.add_argument("--anchors", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.target is None:
        from draftsmith.tiny import build_tiny_target

        args.target = build_tiny_target(log=lambda message: print(message, file=sys.stderr))
    import json

    vocab = json.loads((args.target / "config.json").read_text())["vocab_size"]
    data = write_set(Path(tempfile.mkdtemp()) / "data", samples=4, mean_tokens=args.tokens, vocab=vocab)
    rank = min(args.markov_rank, vocab)
    print(f"target {args.target.name} (vocab {vocab}), block {args.block_size}, {args.anchors} anchors x 2 samples of "
          f"~{args.tokens} tokens, Markov rank {rank}, {args.threads} thread(s); forward+backward of one micro-batch, "
          f"best of {args.repeats}")
    for layers in args.layers:
        dflash = _trainer(args.target, data, layers, args.block_size, args.anchors)
        dspark = _trainer(args.target, data, layers, args.block_size, args.anchors, drafter="dspark", markov_rank=rank)
        times = {"dflash": [], "dspark": []}
        for _ in range(args.repeats + 1):  # the first round warms up
            times["dflash"].append(_step(dflash, [0, 1]))
            times["dspark"].append(_step(dspark, [0, 1]))
        best = {name: min(values[1:]) for name, values in times.items()}
        print(f"  {layers} layer(s): DFlash {best['dflash'] * 1e3:7.1f} ms, DSpark {best['dspark'] * 1e3:7.1f} ms, "
              f"ratio {best['dspark'] / best['dflash']:.2f}x")


if __name__ == "__main__":
    main()
