"""Speculative decoding with a DFlash drafter vs plain greedy decoding, in the same process.

    python benchmarks/speculative_decoding.py --drafter DIR [--target DIR] [--prompts N] [--max-new-tokens N]

Without --target the built-in tiny target is used (built or reused from the cache) and prompts are
synthetic ones it was not trained on. Prints tau and the tokens/s ratio against the baseline;
greedy outputs must be identical (the run fails otherwise).
"""

from __future__ import annotations

import argparse

import torch
from rich.console import Console

from draftsmith.evaluate import evaluate_drafter
from draftsmith.tiny import build_tiny_target, synthetic_prompts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--drafter", required=True)
    parser.add_argument("--target", default=None)
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--seed", type=int, default=1234)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()

    torch.set_num_threads(args.threads)
    target = args.target or build_tiny_target()
    report = evaluate_drafter(
        target,
        args.drafter,
        list(synthetic_prompts(args.prompts, seed=args.seed)),
        max_new_tokens=args.max_new_tokens,
        dtype=getattr(torch, args.dtype),
    )
    report.render(Console())
    print(
        f"baseline plain greedy: {report.target_tokens_per_s:.1f} tok/s; speculative: "
        f"{report.speculative_tokens_per_s:.1f} tok/s; ratio {report.speedup:.2f}x at tau {report.tau:.2f}"
    )


if __name__ == "__main__":
    main()
