"""`draftsmith demo`: prompts -> regenerated data -> audit -> drafter -> tau, on the tiny default.

The same path a real run takes, at toy scale: the tiny target is served over a real
OpenAI-compatible HTTP server, `generate` regenerates every completion with thinking on, `tokenize`
builds loss-masked rows from the engine's own token ids and audits them, `plan` extrapolates the
measured throughput to the seed's question (914k samples x 2,500 tokens), `train` fits a DFlash
drafter online, `eval` measures acceptance length by real speculative decoding against an
untrained drafter of the same shape, and `export` writes the serving checkpoint. `--target
smollm2-135m` runs the same stages on a real pretrained model (fetched by `draftsmith.models`).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Callable

from draftsmith.core.errors import DraftsmithError, InputError
from draftsmith.core.io import refuse_replaced_link, write_json_atomic
from draftsmith.core.limits import choose_threads
from draftsmith.core.lock import claim_directory, lock_directory
from draftsmith.demo.config import SEED_OUTPUT_TOKENS, SEED_SAMPLES, DemoConfig, DemoResult

MARKER = ".draftsmith-demo"
TINY = "tiny"


@contextlib.contextmanager
def _stage(name: str, timings: dict[str, float], log: Callable[[str], None]) -> Iterator[None]:
    log(f"[demo] {name} ...")
    started = time.monotonic()
    try:
        yield
    finally:
        timings[name] = round(time.monotonic() - started, 1)
    log(f"[demo] {name} done in {timings[name]:.1f}s")


@contextlib.contextmanager
def _quiet_model_loading() -> Iterator[None]:
    """No "Loading weights" bars from transformers in the demo's log (here or in the served target)."""
    from transformers.utils import logging as transformers_logging

    previous = os.environ.get("HF_HUB_DISABLE_PROGRESS_BARS")
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # inherited by the serving subprocess
    was_enabled = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_enabled:
            transformers_logging.enable_progress_bar()
        if previous is None:
            os.environ.pop("HF_HUB_DISABLE_PROGRESS_BARS", None)
        else:
            os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = previous


def _fresh_workdir(work: Path) -> None:
    """A demo is a measurement: start clean so every number comes from this run. Only a directory an
    earlier demo made (it holds the marker) is ever deleted."""
    if work.exists() and any(work.iterdir()):
        if not (work / MARKER).exists():
            raise InputError(f"{work}: not empty and not a demo directory; choose another --workdir")
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    (work / MARKER).write_text("made by `draftsmith demo`; rerunning the demo replaces this directory\n")
    claim_directory(work, "demo")


def _write_prompts(config: DemoConfig, work: Path) -> tuple[Path, Path]:
    from draftsmith.tiny import synthetic_prompts

    prompts_file, eval_file = work / "prompts.jsonl", work / "eval_prompts.jsonl"
    # Held-out evaluation prompts come from another seed, so their ids never meet the training set.
    for path, rows in ((prompts_file, synthetic_prompts(config.train_prompts, seed=config.seed + 1)),
                       (eval_file, synthetic_prompts(config.eval_prompts, seed=config.seed + 1000))):
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return prompts_file, eval_file


def _generate(config: DemoConfig, target: Path, prompts_file: Path, work: Path, log) -> Any:
    from draftsmith.generate import GenerateConfig, generate
    from draftsmith.generate.config import GuardConfig
    from draftsmith.serve.process import ServeProcess

    # A small real model loops on some of the synthetic prompts until --max-tokens (SmolLM2-135M:
    # 40% at 128 tokens). That is the model, not a broken run: the guard lets it finish, and
    # tokenize drops the cut answers as it always does (the audit then gates what is left).
    guard = GuardConfig() if config.target == TINY else GuardConfig(max_length_finish=1.0)
    # Greedy regeneration: the drafter learns exactly what the target says at T=0, which is what
    # the greedy, lossless eval below measures.
    with ServeProcess(["--model", str(target), "--served-model-name", config.target,
                       "--max-batch-size", str(config.concurrency)]) as server:
        summary = generate(
            GenerateConfig(inputs=[prompts_file], output_dir=work / "generated", endpoints=[server.url],
                           max_tokens=config.max_tokens, temperature=0.0, top_p=None,
                           concurrency=config.concurrency, return_token_ids=True, progress=False,
                           target=target, guard=guard),  # its chat template decides thinking (the tiny target's: on)
            log=log,
        )
    if not summary.ok:
        raise DraftsmithError("demo: generate did not finish cleanly: " + "; ".join(summary.problems()))
    log(f"[demo] generated {summary.done} rows, {summary.output_tokens_per_s:,.0f} output tok/s")
    return summary


def _tokenize_and_audit(target: Path, work: Path, log) -> tuple[Path, Any]:
    from draftsmith.audit import audit_tokenized
    from draftsmith.tokenize import TokenizeOptions, tokenize_dataset

    tokenized = work / "tokenized"
    tokenize_dataset([work / "generated"], target, tokenized, TokenizeOptions(overwrite=True, progress=False, workers=1))
    report = audit_tokenized(tokenized, tokenizer=str(target))
    log(f"[demo] audit: {report.verdict}")
    if not report.passed:
        raise DraftsmithError(f"demo: the audit failed, not training on this data: {report.verdict}")
    return tokenized, report


def plan_seed_question(tokens_per_s: float) -> float:
    """Days to regenerate the seed's question (914k samples x 2,500 output tokens) on one GPU at the
    rate the demo measured on its one server."""
    from draftsmith.plan import make_plan

    plan = make_plan({"samples": str(SEED_SAMPLES), "output_mean": str(SEED_OUTPUT_TOKENS),
                      "per_gpu": f"{tokens_per_s:.3f} tok/s", "gpus": "1"})
    return plan.to_dict()["wall_time"]["days"]


def _train(config: DemoConfig, target: Path, tokenized: Path, work: Path, log, threads: int | None = None) -> Any:
    import torch

    from draftsmith.train import TrainConfig, train_drafter

    result = train_drafter(
        TrainConfig(target=target, data=tokenized, out=work / "train", block_size=config.block_size,
                    num_draft_layers=config.draft_layers, max_steps=config.train_steps, epochs=1000,
                    batch_size=config.batch_size, lr=config.lr, seed=config.seed, progress=False,
                    log_every=max(1, config.train_steps // 6), num_threads=threads or config.threads,
                    dtype=config.resolved_train_dtype(cuda=torch.cuda.is_available()))
    )
    log(f"[demo] train: loss {result.first_loss:.3f} -> {result.final_loss:.3f} in {result.steps} steps")
    return result


def _evaluate(config: DemoConfig, target: Path, drafter_dir: Path, eval_file: Path, log) -> dict[str, Any]:
    import torch

    from draftsmith.evaluate.speculative import evaluate_drafter
    from draftsmith.model import DFlashDraftModel, load_drafter

    trained = load_drafter(drafter_dir)
    torch.manual_seed(config.seed)
    untrained = DFlashDraftModel(trained.config).eval()
    reports = {
        name: evaluate_drafter(target, drafter, eval_file, max_new_tokens=config.eval_max_new_tokens,
                               enable_thinking=None)
        for name, drafter in (("untrained", untrained), ("trained", trained))
    }
    for name, report in reports.items():
        log(f"[demo] eval {name}: tau {report.tau:.2f}, speed-up {report.speedup:.2f}x, lossless {report.lossless}")
    return reports


def run_demo(config: DemoConfig | None = None, log: Callable[[str], None] = print) -> DemoResult:
    """Run every stage on the tiny default; raises `DraftsmithError` when a stage's gate fails."""
    config = config or DemoConfig()
    work = refuse_replaced_link(Path(config.workdir), "--workdir", "demo")
    # The workdir is deleted and made again, so its lock lives beside it.
    with lock_directory(work, "demo", lock_file=work.parent / f".{work.name}.draftsmith.lock"):
        _fresh_workdir(work)
        with _quiet_model_loading():
            return _run_stages(config, work, log)


def _run_stages(config: DemoConfig, work: Path, log: Callable[[str], None]) -> DemoResult:
    from draftsmith.export.exporter import export_drafter

    # Every stage here runs in this process: one choice (from the machine's load unless --threads).
    threads, threads_line = choose_threads(config.threads)
    log(f"[demo] {threads_line}")
    timings: dict[str, float] = {}
    if config.target == TINY:
        from draftsmith.tiny import build_tiny_target

        with _stage("build the tiny target", timings, log):
            target = build_tiny_target(log=log)
    else:
        from draftsmith.models import fetch_model

        with _stage(f"fetch the real target {config.target}", timings, log):
            target = fetch_model(config.target, log=log).hf_dir
    prompts_file, eval_file = _write_prompts(config, work)
    with _stage(f"generate ({config.target} served over HTTP, thinking as its chat template has it)",
                timings, log):
        summary = _generate(config, target, prompts_file, work, log)
    with _stage("tokenize + audit", timings, log):
        tokenized, report = _tokenize_and_audit(target, work, log)
    with _stage("plan", timings, log):
        plan_days = plan_seed_question(summary.output_tokens_per_s)
        log(f"[demo] plan: {SEED_SAMPLES:,} samples x {SEED_OUTPUT_TOKENS:,} output tokens at this per-GPU rate "
            f"({summary.output_tokens_per_s:,.0f} tok/s) would take {plan_days:,.1f} GPU-days")
    with _stage("train the DFlash drafter (online)", timings, log):
        result = _train(config, target, tokenized, work, log, threads)
    with _stage("eval: speculative decoding, trained vs untrained drafter", timings, log):
        reports = _evaluate(config, target, result.drafter_dir, eval_file, log)
    with _stage("export", timings, log):
        export_dir = work / "export"
        export_drafter(result.drafter_dir, export_dir, overwrite=True)
    outcome = DemoResult(
        target_dir=str(target), rows_file=str(summary.rows_file), tokenized_dir=str(tokenized),
        drafter_dir=str(result.drafter_dir), export_dir=str(export_dir), generated=summary.done,
        generate_tokens_per_s=summary.output_tokens_per_s, audit_verdict=report.verdict,
        plan_days_for_914k=plan_days, train_first_loss=result.first_loss, train_final_loss=result.final_loss,
        train_steps=result.steps, train_seconds=result.elapsed_s, tau_trained=reports["trained"].tau,
        tau_untrained=reports["untrained"].tau, speedup_trained=reports["trained"].speedup,
        lossless=all(r.lossless for r in reports.values()), stage_seconds=timings,
    )
    write_json_atomic(work / "demo_result.json", outcome.to_dict())
    return outcome
