"""Does `plan data` predict what more data gives? Fit the curve on subsets up to a quarter of a
regenerated set, predict tau at the whole set, then train on the whole set and measure it.

    PYTHONPATH=src python benchmarks/bench_plan_data.py --samples 2560 --seeds 2 --threads 2

Data: the tiny target regenerates --samples synthetic prompts through the demo's stages (served over
HTTP, tokenized, audited; held-out prompts disjoint from them), kept in --workdir so a rerun reuses
them, and every finished subset's run too (plan data resumes). The recipe is bench_recipes' tiny
one (block 16, 2 layers, lr 5e-3, batch 4) at a fixed number of epochs. Pass: the measured tau at
the whole set lies inside the predicted interval and within 10% of the point prediction.
Progress goes to stderr, the table to stdout; `--json FILE` writes every number.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import bench_recipes  # noqa: E402


def log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--samples", type=int, default=2560, help="regenerated samples in all (the size predicted)")
    parser.add_argument("--fit-fractions", default="0.03125,0.0625,0.125,0.25", help="subsets the curve is fitted on")
    parser.add_argument("--seeds", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--eval-prompts", type=int, default=24)
    parser.add_argument("--eval-max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=Path("runs/bench_plan_data"))
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()

    import torch

    from draftsmith.datacurve import DataCurveConfig
    from draftsmith.datacurve.runner import plan_data

    torch.set_num_threads(args.threads)
    settings = {**bench_recipes.TARGETS["tiny"], "train_prompts": args.samples, "eval_prompts": args.eval_prompts}
    started = time.perf_counter()
    target, tokenized, held_out = bench_recipes.tiny_data(settings, args.workdir / "data")
    data_seconds = time.perf_counter() - started
    from draftsmith.data.tokenized import load_tokenized

    available = len(load_tokenized(tokenized))
    fit_sizes = [max(4, int(round(float(f) * available))) for f in args.fit_fractions.split(",")]
    recipe = dict(target=target, data=tokenized, eval_prompts=held_out, out=args.workdir / "curve",
                  block_size=settings["block_size"], num_draft_layers=settings["draft_layers"], lr=settings["lr"],
                  batch_size=settings["batch_size"], num_anchors=settings["num_anchors"], max_length=settings["max_length"],
                  epochs=args.epochs, seeds=args.seeds, eval_max_new_tokens=args.eval_max_new_tokens,
                  num_threads=args.threads, data_workers=0, progress=False)
    started = time.perf_counter()
    fitted = plan_data(DataCurveConfig(**recipe, sizes=fit_sizes, samples=str(available)), log=log)
    fit_seconds = time.perf_counter() - started
    [predicted] = [row for row in fitted.plan if row.label == "planned (--samples)"]
    started = time.perf_counter()
    full = plan_data(DataCurveConfig(**recipe, sizes=[*fit_sizes, available]), log=log)
    full_seconds = time.perf_counter() - started
    [whole] = [row for row in full.rows if row.size == available]
    measured = whole.mean_tau
    inside = predicted.low <= measured <= predicted.high
    error = abs(predicted.tau - measured) / measured
    lines = [
        f"tiny target, {available:,} regenerated samples ({data_seconds:.0f} s), {args.seeds} seed(s), {args.epochs} epochs, "
        f"{args.eval_prompts} held-out prompts; fit on {', '.join(map(str, fit_sizes))} ({fit_seconds:.0f} s), "
        f"whole set trained and measured ({full_seconds:.0f} s)",
        f"method: {fitted.method} ({fitted.method_reason})",
        "",
        "| samples | measured tau (per seed) | predicted tau | 90% interval |",
        "|---:|---|---:|---|",
        *(f"| {row.size:,} | {row.mean_tau:.3f} ({', '.join(f'{t:.2f}' for t in row.tau)}) | fit point | |" for row in fitted.rows),
        f"| {available:,} | {measured:.3f} ({', '.join(f'{t:.2f}' for t in whole.tau)}) | {predicted.tau:.3f} | "
        f"{predicted.low:.3f}-{predicted.high:.3f} |",
        "",
        f"measured / predicted {measured / predicted.tau:.3f}x; inside the interval: {'yes' if inside else 'NO'}; "
        f"within 10%: {'yes' if error <= 0.10 else 'NO'} ({error:.1%})",
    ]
    print("\n".join(lines))
    if args.json:
        args.json.write_text(json.dumps({"fitted": fitted.to_dict(), "full": full.to_dict(), "measured": measured,
                                         "predicted": predicted.__dict__, "inside": inside, "error": error}, indent=1))
    return 0 if inside and error <= 0.10 else 1


if __name__ == "__main__":
    sys.exit(main())
