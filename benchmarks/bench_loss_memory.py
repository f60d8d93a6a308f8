"""Benchmark: peak memory of the training loss, one pass over every scored row vs chunked.

At the defaults a micro-batch sequence has 512 blocks x 15 predictions = 7,680 rows, each scored
over the target's whole vocabulary (151,936 for Qwen3): ~4.7 GB of fp32 logits and as much again
for their gradient if every row is scored at once. `dflash_loss_from_hidden` scores `chunk_rows`
rows at a time and recomputes each chunk's logits in backward, so only one chunk is alive.

Each variant runs forward+backward in a fresh process; on CPU the number is the process's peak
resident memory above what it held just before (VmHWM reset through /proc/self/clear_refs), on
CUDA `torch.cuda.max_memory_allocated` above the inputs. The default shape is the real vocabulary
and the default block count scaled down 8x for a CPU (64 blocks, chunks of 1024/8 rows):

    PYTHONPATH=src python benchmarks/bench_loss_memory.py [--anchors 64] [--chunk-rows 128] [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time


def _peak_rss_bytes() -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _reset_peak_rss() -> None:
    with open("/proc/self/clear_refs", "w") as handle:
        handle.write("5")


def run_variant(args) -> dict:
    """One forward+backward of the loss in this process; its peak memory above the inputs."""
    import torch

    from draftsmith.train.loss import dflash_loss, dflash_loss_from_hidden, position_weights

    torch.set_num_threads(1)
    device = torch.device(args.device)
    torch.manual_seed(0)
    head = torch.nn.Linear(args.hidden, args.vocab, bias=False, device=device).requires_grad_(False)
    shape = (1, args.anchors, args.block_size - 1)
    hidden = torch.randn(*shape, args.hidden, device=device, requires_grad=True)
    labels = torch.randint(0, args.vocab, shape, device=device)
    label_mask = (torch.rand(shape, device=device) < args.kept).float()
    weights = position_weights(args.block_size).to(device)
    if args.variant == "all positions":
        def loss_fn():
            return dflash_loss(head(hidden), labels, label_mask, weights).loss
    else:
        chunk_rows = None if args.variant == "unmasked, one pass" else args.chunk_rows
        def loss_fn():
            return dflash_loss_from_hidden(hidden, head, labels, label_mask, weights, chunk_rows=chunk_rows).loss

    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        before = torch.cuda.memory_allocated()
    else:
        _reset_peak_rss()
        before = _peak_rss_bytes()
    start = time.perf_counter()
    loss = loss_fn()
    loss.backward()
    if device.type == "cuda":
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
    else:
        peak = _peak_rss_bytes() - before
    return {"variant": args.variant, "peak_bytes": peak, "seconds": time.perf_counter() - start,
            "loss": float(loss), "rows": int(label_mask.sum())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--anchors", type=int, default=64, help="blocks in the micro-batch (default: 512 / 8)")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--kept", type=float, default=0.9, help="share of predictions that carry loss")
    parser.add_argument("--chunk-rows", type=int, default=128, help="rows scored at once (default: 1024 / 8)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--variant", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.variant:
        print(json.dumps(run_variant(args)))
        return

    variants = ["all positions", "unmasked, one pass", f"chunked ({args.chunk_rows} rows)"]
    results = []
    for variant in variants:
        command = [sys.executable, __file__, "--variant", variant, *sys.argv[1:]]
        output = subprocess.run(command, capture_output=True, text=True, check=True, env=os.environ.copy())
        results.append(json.loads(output.stdout.strip().splitlines()[-1]))
    losses = {round(result["loss"], 5) for result in results[1:]}
    print(f"loss forward+backward, vocab {args.vocab}, hidden {args.hidden}, {args.anchors} blocks x "
          f"{args.block_size - 1} predictions ({results[0]['rows']} carry loss), {args.device}")
    for result in results:
        print(f"  {result['variant']:<22} peak {result['peak_bytes'] / 2**20:8.1f} MiB   {result['seconds'] * 1e3:8.1f} ms")
    print(f"  one pass / chunked     {results[1]['peak_bytes'] / max(1, results[2]['peak_bytes']):.1f}x less memory;"
          f" losses equal: {len(losses) == 1}")


if __name__ == "__main__":
    main()
