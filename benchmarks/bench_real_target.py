"""A DFlash drafter trained on a real target (SmolLM2-135M-Instruct) within a fixed CPU budget, against
the untrained drafter and prompt-lookup (n-gram) speculation on the same held-out prompts.

    PYTHONPATH=src python benchmarks/bench_real_target.py --budget-minutes 30 --threads 2     # the full run
    PYTHONPATH=src python benchmarks/bench_real_target.py --budget-minutes 5 --train-prompts 60 \\
        --eval-prompts 12 --eval-max-new-tokens 96 --model-dir DIR --gguf FILE                  # a quick one

Stages: the prompts of benchmarks/data/real_target_prompts.jsonl (300 hand-written: chat, code, math,
explanation) are split into held-out eval prompts (spread over the domains) and training prompts;
the training prompts are regenerated greedily by the target served by llama-server (its GGUF),
tokenized with the target's chat template, the target's features are extracted once (`--no-offline`:
the target runs every step instead), and a drafter trains in bf16 (`--dtype`) for as many steps as the
budget allows (measured by a short timing run first; the timing run and the extraction count against
the budget); checkpoints along the way give the learning curve. Eval decodes the held-out prompts once plainly and with
every drafter (trained, each checkpoint, untrained) and with prompt lookup: tau of each, all
checked lossless against the same plain output. Prints a table; `--json FILE` writes the numbers.
"""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROMPTS = HERE / "data" / "real_target_prompts.jsonl"


def log(message: str) -> None:
    print(f"[bench_real_target {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def resolve_model(args) -> tuple[Path, Path]:
    """(HF dir, GGUF) of SmolLM2-135M: `draftsmith.models.fetch_model` when this draftsmith has it,
    else --model-dir (and --gguf, or a conversion of --model-dir)."""
    if args.model_dir is None:
        try:
            from draftsmith.models import fetch_model
        except ImportError:
            sys.exit("bench_real_target: this draftsmith has no `models` module; pass --model-dir (and --gguf)")
        model = fetch_model("smollm2-135m")
        return Path(model.hf_dir), Path(model.gguf)
    if args.gguf is not None:
        return args.model_dir, args.gguf
    from draftsmith.engines.gguf import convert_to_gguf

    return args.model_dir, convert_to_gguf(args.model_dir)


def split_prompts(path: Path, eval_count: int, train_count: int | None) -> tuple[list[dict], list[dict]]:
    """(eval rows, train rows): eval rows taken evenly from each domain, never trained on."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    by_domain: dict[str, list[dict]] = {}
    for row in rows:
        by_domain.setdefault(row["domain"], []).append(row)
    per_domain = -(-eval_count // len(by_domain))
    picked = [rows[:: max(1, len(rows) // per_domain)][:per_domain] for rows in by_domain.values()]
    # Interleaved by domain, so that --eval-limit N still decodes every domain.
    held_out = [row for group in itertools.zip_longest(*picked) for row in group if row is not None][:eval_count]
    eval_ids = {row["id"] for row in held_out}
    # Training rows interleave the domains, so a smaller --train-prompts still covers all of them.
    remaining = [[row for row in domain_rows if row["id"] not in eval_ids] for domain_rows in by_domain.values()]
    train = [row for group in zip(*remaining) for row in group]
    train += [row for group in remaining for row in group[min(map(len, remaining)):]]
    return held_out, train[:train_count] if train_count else train


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps({"id": r["id"], "messages": r["messages"]}) + "\n" for r in rows))
    return path


def regenerate(args, gguf: Path, target: Path, prompts_file: Path, work: Path):
    from draftsmith.engines.launch import llama_server
    from draftsmith.generate import GenerateConfig, generate
    from draftsmith.generate.config import GuardConfig

    with llama_server(gguf, alias="smollm2", parallel=args.parallel, ctx_size=args.parallel * 2048,
                      threads=args.llama_threads, reasoning_format="none", log_path=work / "llama-server.log") as server:
        summary = generate(GenerateConfig(
            inputs=[prompts_file], output_dir=work / "generated", endpoints=[server.api_url], model="smollm2",
            max_tokens=args.max_tokens, temperature=0.0, top_p=None, concurrency=args.parallel, progress=False,
            target=target,  # its chat template decides thinking (SmolLM2's has none)
            # An answer cut at --max-tokens still trains the drafter: the guard does not stop the run for it.
            guard=GuardConfig(max_length_finish=1.0),
        ), log=log)
    if not summary.ok:
        sys.exit("bench_real_target: generate did not finish cleanly: " + "; ".join(summary.problems()))
    log(f"generated {summary.done} rows at {summary.output_tokens_per_s:,.0f} output tok/s")
    return summary


def train_config(args, target: Path, data: Path, out: Path, features: Path | None, **overrides):
    from draftsmith.train import TrainConfig

    settings = dict(
        target=target, data=data, out=out, block_size=args.block_size, num_draft_layers=args.draft_layers,
        mask_token_id=args.mask_token_id, num_anchors=args.num_anchors, max_length=args.max_length, lr=args.lr,
        epochs=1000, seed=args.seed, progress=False, num_threads=args.threads, data_workers=0, log_every=10,
        dtype=args.dtype, offline_features=features,
    )
    settings.update(overrides)
    return TrainConfig(**settings)


def extract_once(args, target: Path, data: Path, work: Path) -> tuple[Path | None, float]:
    """(features directory or None when training online, seconds it took): the target runs over the
    training set once, and every init's budget pays for it."""
    if not args.offline:
        return None, 0.0
    from draftsmith.train import extract_features

    started = time.perf_counter()
    features = work / "features"
    extract_features(target, data, features, max_length=args.max_length, progress=False, echo=log)
    spent = time.perf_counter() - started
    log(f"extracted the target's features once in {spent / 60:.1f} min (charged to each training budget)")
    return features, spent


def train_within_budget(args, target: Path, data: Path, features: Path | None, extract_s: float, work: Path,
                        init_from_target: bool):
    """(train result, checkpoints oldest first, seconds spent, planned steps): a timing run, then as
    many steps as the rest of the budget holds (the feature extraction counts against it)."""
    from draftsmith.train import train_drafter
    from draftsmith.train.benchmark import benchmark_training

    started = time.perf_counter() - extract_s
    timing = benchmark_training(train_config(args, target, data, work.with_name(work.name + "-timing"), features,
                                             benchmark_steps=3))
    step_s = 1.0 / timing["steps_per_s"]
    left = args.budget_minutes * 60 - (time.perf_counter() - started)
    # 10% headroom for model loading, checkpoints and the final save. Step times vary with sample
    # lengths (a 30-minute run planned from 3 timed steps overran by 5 minutes): --max-minutes is the
    # hard stop, and the planned steps only shape the learning-rate schedule.
    steps = max(1, int(0.9 * left / step_s))
    every = max(1, steps // args.curve_points)
    log(f"timing: {step_s:.2f} s/step -> {steps} steps in the {left / 60:.1f} min left, a checkpoint every {every}")
    left = args.budget_minutes * 60 - (time.perf_counter() - started)
    result = train_drafter(train_config(args, target, data, work, features, max_steps=steps, save_every=every,
                                        max_minutes=max(0.1, 0.97 * left / 60),
                                        keep_checkpoints=args.curve_points + 2, init_from_target=init_from_target))
    spent = time.perf_counter() - started
    # The last checkpoint is the final drafter when the steps divide evenly: decode it once.
    checkpoints = [path for path in sorted((work / "checkpoints").glob("step-*")) if step_of(path) != result.steps]
    log(f"trained {result.steps} steps, {result.tokens_seen:,} tokens, loss {result.first_loss:.3f} -> "
        f"{result.final_loss:.3f}, {spent / 60:.1f} min of the {args.budget_minutes:g} min budget")
    return result, checkpoints, spent, steps


def step_of(checkpoint: Path) -> int:
    return int(checkpoint.name.split("-")[1])


def tokens_seen(checkpoint: Path) -> int:
    from draftsmith.train.checkpoints import load_trainer_state

    return int(load_trainer_state(checkpoint)["tokens_seen"])


def prepare_data(args, gguf: Path | None, target: Path, train_file: Path, eval_file: Path, work: Path) -> tuple[Path, int]:
    """(tokenized dir, training samples): regenerated here, or taken from --data-from (same split)."""
    from draftsmith.train import load_tokenized
    from draftsmith.tokenize import TokenizeOptions, tokenize_dataset

    if args.data_from is not None:
        if sorted((args.data_from / "eval_prompts.jsonl").read_text().splitlines()) != sorted(eval_file.read_text().splitlines()):
            sys.exit(f"bench_real_target: {args.data_from} held out other prompts; use the same --eval-prompts")
        tokenized = args.data_from / "tokenized"
        log(f"reusing the regenerated, tokenized data of {args.data_from}")
    else:
        regenerate(args, gguf, target, train_file, work)
        tokenized = work / "tokenized"
        # An answer cut at --max-tokens is still the target's own greedy text: keep it for training.
        tokenize_dataset([work / "generated"], target, tokenized,
                         TokenizeOptions(overwrite=True, progress=False, workers=1, length_policy="keep"))
    return tokenized, len(load_tokenized(tokenized))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model-dir", type=Path, help="SmolLM2-135M-Instruct HF folder (default: draftsmith models fetch)")
    parser.add_argument("--gguf", type=Path, help="its GGUF for llama-server (default: converted from --model-dir)")
    parser.add_argument("--prompts", type=Path, default=PROMPTS)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bench_real_target"))
    parser.add_argument("--train-prompts", type=int, default=None, help="default: every prompt not held out")
    parser.add_argument("--eval-prompts", type=int, default=40)
    parser.add_argument("--max-tokens", type=int, default=512, help="generation cap per training answer")
    parser.add_argument("--budget-minutes", type=float, default=30.0, help="training wall time, timing run included")
    parser.add_argument("--threads", type=int, default=2, help="torch threads for training and eval")
    parser.add_argument("--llama-threads", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=4, help="llama-server slots = generate concurrency")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--draft-layers", type=int, default=3)
    parser.add_argument("--num-anchors", type=int, default=128)
    parser.add_argument("--max-length", type=int, default=1024)
    parser.add_argument("--lr", type=float, default=6e-4)
    parser.add_argument("--dtype", default="bf16", choices=["fp32", "bf16"],
                        help="training compute dtype (bf16: the frozen target and head in bf16, the drafter's weights "
                             "fp32 under autocast; fast where the CPU has bf16 matrix units such as AMX)")
    parser.add_argument("--offline", action=argparse.BooleanOptionalAction, default=True,
                        help="extract the target's features once and train offline (default), or run the target every step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--mask-token-id", type=int, default=None, help="default: chosen from the target, as train does")
    parser.add_argument("--curve-points", type=int, default=4, help="checkpoints evaluated for the learning curve")
    parser.add_argument("--eval-max-new-tokens", type=int, default=128)
    parser.add_argument("--eval-limit", type=int, default=None, help="decode only the first N held-out prompts")
    parser.add_argument("--init", choices=["random", "target", "both"], default="random",
                        help="drafter start: random, copies of the target's last layers, or both (each its own budget)")
    parser.add_argument("--data-from", type=Path,
                        help="reuse the regenerated, tokenized data of an earlier run's --workdir (same prompt split)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the regeneration of an interrupted run in --workdir (training restarts)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()

    import torch
    from rich.console import Console
    from rich.table import Table

    from draftsmith.evaluate import evaluate_drafter

    torch.set_num_threads(args.threads)
    target, gguf = resolve_model(args) if args.data_from is None else (args.model_dir or resolve_model(args)[0], None)
    work = args.workdir
    if work.exists() and any(work.iterdir()):
        if not args.resume:
            sys.exit(f"bench_real_target: {work} is not empty; give a fresh --workdir or --resume")
        for old in [*work.glob("train-*"), *work.glob("features")]:  # training and eval start afresh; generation resumes by sample id
            shutil.rmtree(old)
    work.mkdir(parents=True, exist_ok=True)
    held_out, train_rows = split_prompts(args.prompts, args.eval_prompts, args.train_prompts)
    eval_file, train_file = write_rows(work / "eval_prompts.jsonl", held_out), write_rows(work / "train_prompts.jsonl", train_rows)
    log(f"{len(train_rows)} training prompts, {len(held_out)} held-out prompts; target {target}, GGUF {gguf}")

    tokenized, samples = prepare_data(args, gguf, target, train_file, eval_file, work)
    inits = ["random", "target"] if args.init == "both" else [args.init]
    features, extract_s = extract_once(args, target, tokenized, work)
    results_extract = {"offline": args.offline, "extract_minutes": extract_s / 60}
    trained = {init: train_within_budget(args, target, tokenized, features, extract_s, work / f"train-{init}",
                                         init == "target")
               for init in inits}

    drafters, curve_of = {}, {}
    for init, (result, checkpoints, _, _) in trained.items():
        drafters[f"trained ({init} init)"] = result.drafter_dir
        curve_of[init] = [(f"{init} init, step {step_of(path)}", path) for path in checkpoints]
        drafters.update(curve_of[init])
    main_name, main_dir = next(iter(drafters.items()))
    started = time.perf_counter()
    report = evaluate_drafter(
        target, main_dir, eval_file, max_new_tokens=args.eval_max_new_tokens, block_size=args.block_size,
        limit=args.eval_limit,
        baselines=["ngram", "untrained"], more_drafters={k: v for k, v in drafters.items() if k != main_name},
        seed=args.seed, strict=True,
        progress=lambda done, total: log(f"eval {done}/{total} prompts"),
    )
    log(f"eval took {(time.perf_counter() - started) / 60:.1f} min")
    by_method = {r.method: r for r in report.methods}
    by_method[main_name] = by_method.pop("dflash")

    table = Table(title=f"SmolLM2-135M target, {report.num_prompts} held-out prompts, block {report.block_size}, "
                        f"{args.eval_max_new_tokens} new tokens, greedy (all lossless: {not report.not_lossless})")
    for column in ("drafter", "training tokens", "tau", "speed-up (CPU)"):
        table.add_column(column, justify="left" if column == "drafter" else "right")
    table.add_row("n-gram (prompt lookup)", "", f"{by_method['ngram'].tau:.3f}", f"{by_method['ngram'].speedup:.2f}x")
    table.add_row("untrained", "0", f"{by_method['untrained'].tau:.3f}", f"{by_method['untrained'].speedup:.2f}x")
    results: dict = {"n-gram": by_method["ngram"].tau, "untrained": by_method["untrained"].tau}
    curves: dict = {}
    for init, (result, _, spent, planned) in trained.items():
        curves[init] = [{"checkpoint": name, "train_tokens": tokens_seen(path), "tau": by_method[name].tau}
                        for name, path in curve_of[init]]
        for point in curves[init]:
            table.add_row(point["checkpoint"], f"{point['train_tokens']:,}", f"{point['tau']:.3f}",
                          f"{by_method[point['checkpoint']].speedup:.2f}x")
        final = by_method[f"trained ({init} init)"]
        table.add_row(f"trained ({init} init), step {result.steps}", f"{result.tokens_seen:,}", f"{final.tau:.3f}",
                      f"{final.speedup:.2f}x")
        curves[init].append({"checkpoint": f"step {result.steps}", "train_tokens": result.tokens_seen, "tau": final.tau})
        results[f"trained ({init} init)"] = {"tau": final.tau, "steps": result.steps, "planned_steps": planned,
                                             "train_tokens": result.tokens_seen, "train_minutes": spent / 60,
                                             "first_loss": result.first_loss, "final_loss": result.final_loss}
    Console().print(table)
    for init in trained:
        tau = results[f"trained ({init} init)"]["tau"]
        verdict = "above" if tau > results["n-gram"] else "NOT above"
        print(f"trained ({init} init) tau {tau:.3f} is {verdict} n-gram tau {results['n-gram']:.3f} "
              f"(untrained {results['untrained']:.3f}); {trained[init][0].steps} steps, {trained[init][0].tokens_seen:,} "
              f"tokens, {trained[init][2] / 60:.1f} min of {args.budget_minutes:g} on {args.threads} threads; "
              f"{samples} training samples")
    if args.json:
        args.json.write_text(json.dumps({
            "kind": "draftsmith.bench_real_target", "target": str(target), "budget_minutes": args.budget_minutes,
            "threads": args.threads, "train_samples": samples, "block_size": report.block_size,
            "eval_prompts": report.num_prompts, "lossless": not report.not_lossless, "results": results,
            "learning_curves": curves, "features": results_extract,
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
