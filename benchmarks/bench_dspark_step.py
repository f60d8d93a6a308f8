"""Benchmark: a DSpark training step against a DFlash step of the same depth, on the CPU, in one process.

Both trainers get the same target, data, micro-batch, anchors and depth; the step is the forward and
backward of one micro-batch (online: the target forward included, as in training; or offline, from
extracted features), then the optimizer's step, timed apart. The rows are timed interleaved; the
ratios DSpark / DFlash are printed (issue 31 asks for <= 1.3), for each --markov-ranks.

    PYTHONPATH=src python benchmarks/bench_dspark_step.py [--layers 1 2] [--markov-ranks 64,256] [--target DIR]
    # SmolLM2 at bench_recipes' settings (its --workdir holds the tokenized data and the features):
    PYTHONPATH=src python benchmarks/bench_dspark_step.py --target ~/.cache/draftsmith/models/smollm2-135m/hf \
        --data /tmp/bench_recipes/smollm2/data/tokenized --offline-features /tmp/bench_recipes/smollm2/data/features \
        --max-length 1024 --block-size 8 --anchors 4 --batch-size 1 --layers 2 --mask-token-id 16 --markov-ranks 64,256
    # train's own defaults (5 layers, block 16, 512 anchors per document: blocks overlap, and DSpark
    # scores its Markov bias once per distinct previous token of a chunk), features from `draftsmith extract`:
    PYTHONPATH=src python benchmarks/bench_dspark_step.py --target ~/.cache/draftsmith/models/smollm2-135m/hf \
        --data DATA --offline-features FEATURES --layers 5 --block-size 16 --anchors 512 --batch-size 1 \
        --mask-token-id 16 --markov-ranks 64,256 --repeats 3
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_scale import write_set  # noqa: E402

from draftsmith.train import TrainConfig, load_tokenized  # noqa: E402
from draftsmith.train.distributed import init_distributed  # noqa: E402
from draftsmith.train.trainer import DrafterTrainer, build_optimizer  # noqa: E402


def _trainer(target: Path, data: Path, layers: int, block: int, anchors: int, batch: int, **extra) -> DrafterTrainer:
    config = TrainConfig(target=target, data=data, out=Path(tempfile.mkdtemp()), block_size=block, num_draft_layers=layers,
                         num_anchors=anchors, batch_size=batch, dtype="fp32", device="cpu", progress=False, **extra)  # fmt: skip
    return DrafterTrainer(config, init_distributed("cpu"), load_tokenized(data, max_length=config.max_length))


def _step(trainer: DrafterTrainer, optimizer, samples: list[int]) -> tuple[float, float]:
    """(forward + backward, optimizer step) seconds."""
    trainer.drafter.zero_grad(set_to_none=True)
    started = time.perf_counter()
    output, _ = trainer.forward_loss(trainer.drafter, samples, 0)
    output.loss.backward()
    middle = time.perf_counter()
    optimizer.step()
    return middle - started, time.perf_counter() - middle


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", type=Path, default=None, help="target directory (default: the tiny target)")
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--block-size", type=int, default=8, help="DSpark drafts B per block; DFlash B-1")
    parser.add_argument("--equal-drafts", action="store_true",
                        help="DSpark blocks of block-size - 1: both draft as many tokens (the same served K)")
    parser.add_argument("--markov-ranks", default="256", help="comma-separated DSpark ranks (256: the default)")
    parser.add_argument("--data", type=Path, default=None, help="a tokenized set (default: a synthetic one)")
    parser.add_argument("--offline-features", type=Path, default=None, help="train from these extracted features")
    parser.add_argument("--max-length", type=int, default=None)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--anchors", type=int, default=64)
    parser.add_argument("--tokens", type=int, default=600)
    parser.add_argument("--repeats", type=int, default=5, help="steps timed per row (the median kept)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--mask-token-id", type=int, default=None,
                        help="a target without a spare id (SmolLM2: 16, as bench_recipes uses) needs one for DSpark")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.target is None:
        from draftsmith.tiny import build_tiny_target

        args.target = build_tiny_target(log=lambda message: print(message, file=sys.stderr))
    import json

    vocab = json.loads((args.target / "config.json").read_text())["vocab_size"]
    data = args.data or write_set(Path(tempfile.mkdtemp()) / "data", samples=4, mean_tokens=args.tokens, vocab=vocab)
    ranks = [min(int(rank), vocab) for rank in args.markov_ranks.split(",")]
    extra = {"mask_token_id": args.mask_token_id, "offline_features": args.offline_features,
             **({"max_length": args.max_length} if args.max_length else {})}
    count = len(load_tokenized(data, max_length=args.max_length))
    dspark_block = args.block_size - 1 if args.equal_drafts else args.block_size
    batches = [[(index * args.batch_size + j) % count for j in range(args.batch_size)] for index in range(args.repeats + 1)]
    print(f"target {args.target.name} (vocab {vocab}), block {args.block_size}, {args.anchors} anchors x {args.batch_size} "
          f"sample(s) of {data}{' (offline features)' if args.offline_features else ''}, {args.threads} thread(s), "
          f"DSpark block {dspark_block} ({dspark_block} drafts, DFlash {args.block_size - 1}); "
          f"forward+backward of one micro-batch and the optimizer step, median of {args.repeats} interleaved (a first warms up)")
    for layers in args.layers:
        rows = {"dflash": _trainer(args.target, data, layers, args.block_size, args.anchors, args.batch_size, **extra)}
        for rank in ranks:
            rows[f"dspark r{rank}"] = _trainer(args.target, data, layers, dspark_block, args.anchors, args.batch_size,
                                               drafter="dspark", markov_rank=rank, **extra)
        optimizers = {name: build_optimizer(trainer.drafter, trainer.config, 100)[0] for name, trainer in rows.items()}
        times: dict[str, list[tuple[float, float]]] = {name: [] for name in rows}
        for samples in batches:
            for name, trainer in rows.items():
                times[name].append(_step(trainer, optimizers[name], samples))
        medians = {name: (statistics.median(t[0] for t in values[1:]), statistics.median(t[1] for t in values[1:]))
                   for name, values in times.items()}
        base_step, base_opt = medians["dflash"]
        for name, (step, opt) in medians.items():
            print(f"  {layers} layer(s) {name:11s}: forward+backward {step * 1e3:7.1f} ms ({step / base_step:.2f}x), "
                  f"optimizer {opt * 1e3:6.1f} ms, both {(step + opt) / (base_step + base_opt):.2f}x")

if __name__ == "__main__":
    main()
