"""Benchmark: the training loss scoring only unmasked predictions vs scoring every block position.

With a real vocabulary the lm_head logits of every block position dominate a DFlash training step.
`dflash_loss_from_hidden` scores only predictions that carry loss (no padding blocks, no prompt
labels, nothing past the end). This times forward+backward of both on the same inputs and prints
the ratio and the logits memory each needs.

    PYTHONPATH=src python benchmarks/bench_train_loss.py [--vocab 151936] [--hidden 1024] [--anchors 128]
"""

from __future__ import annotations

import argparse
import time

import torch

from draftsmith.train.loss import dflash_loss, dflash_loss_from_hidden, position_weights


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--anchors", type=int, default=128, help="blocks in the micro-batch (incl. padding)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--kept", type=float, default=0.7, help="share of predictions that carry loss")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    torch.manual_seed(0)
    head = torch.nn.Linear(args.hidden, args.vocab, bias=False).requires_grad_(False)
    shape = (1, args.anchors, args.block_size - 1)
    hidden = torch.randn(*shape, args.hidden, requires_grad=True)
    labels = torch.randint(0, args.vocab, shape)
    label_mask = (torch.rand(shape) < args.kept).float()
    weights = position_weights(args.block_size)

    def full():
        return dflash_loss(head(hidden), labels, label_mask, weights).loss

    def selected():
        return dflash_loss_from_hidden(hidden, head, labels, label_mask, weights).loss

    timings = {}
    for name, fn in (("all positions", full), ("unmasked only", selected)):
        best = float("inf")
        for _ in range(args.repeats):
            hidden.grad = None
            start = time.perf_counter()
            fn().backward()
            best = min(best, time.perf_counter() - start)
        timings[name] = best
    positions = label_mask.numel()
    kept = int(label_mask.sum())
    print(f"vocab {args.vocab}, hidden {args.hidden}, {positions} predictions ({kept} carry loss)")
    print(f"  all positions : {timings['all positions'] * 1e3:8.1f} ms, logits {positions * args.vocab * 4 / 2**20:8.1f} MiB")
    print(f"  unmasked only : {timings['unmasked only'] * 1e3:8.1f} ms, logits {kept * args.vocab * 4 / 2**20:8.1f} MiB")
    print(f"  speed ratio   : {timings['all positions'] / timings['unmasked only']:.2f}x")


if __name__ == "__main__":
    main()
