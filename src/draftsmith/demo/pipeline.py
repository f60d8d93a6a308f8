"""`draftsmith demo`: prompts -> regenerated data -> audit -> drafter -> tau, on the tiny default.

The same path a real run takes, at toy scale: the tiny target is served over a real
OpenAI-compatible HTTP server, `generate` regenerates every completion with thinking on, `tokenize`
builds loss-masked rows from the engine's own token ids and audits them, `plan` extrapolates the
measured throughput, `train` fits a DFlash drafter online, `eval` measures acceptance length by
real speculative decoding against an untrained drafter of the same shape, and `export` writes
the serving checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, Callable

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass as config_dataclass

from draftsmith.core.errors import DraftsmithError, InputError


@config_dataclass(config=ConfigDict(use_attribute_docstrings=True, extra="forbid"))
class DemoConfig:
    workdir: Path = Path("runs/demo")
    """Where every stage writes its output (replaced)."""
    train_prompts: Annotated[int, Field(ge=8)] = 320
    """Prompts to regenerate and train on."""
    eval_prompts: Annotated[int, Field(ge=1)] = 12
    """Held-out prompts for speculative decoding."""
    max_tokens: Annotated[int, Field(ge=1)] = 192
    """Output tokens per regenerated sample."""
    concurrency: Annotated[int, Field(ge=1)] = 16
    # The recipe measured on the tiny target: about 2-3 CPU minutes of training for tau ~3.
    block_size: Annotated[int, Field(ge=2)] = 16
    """Drafter block size."""
    draft_layers: Annotated[int, Field(ge=1)] = 1
    train_steps: Annotated[int, Field(ge=1)] = 240
    """Drafter optimizer steps."""
    batch_size: Annotated[int, Field(ge=1)] = 4
    lr: Annotated[float, Field(gt=0)] = 5e-3
    eval_max_new_tokens: Annotated[int, Field(ge=1)] = 128
    threads: Annotated[int | None, Field(ge=1)] = None
    """torch CPU threads (default: torch's choice)."""
    seed: int = 0


@dataclass
class DemoResult:
    target_dir: str
    rows_file: str
    tokenized_dir: str
    drafter_dir: str
    export_dir: str
    generated: int
    generate_tokens_per_s: float
    audit_verdict: str
    plan_days_for_914k: float
    train_first_loss: float
    train_final_loss: float
    train_steps: int
    train_seconds: float
    tau_trained: float
    tau_untrained: float
    speedup_trained: float
    lossless: bool
    stage_seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _stage(name: str, timings: dict[str, float], log: Callable[[str], None]):
    class _Timer:
        def __enter__(self):
            log(f"[demo] {name} ...")
            self.started = time.monotonic()
            return self

        def __exit__(self, *exc):
            timings[name] = round(time.monotonic() - self.started, 1)
            if exc[0] is None:
                log(f"[demo] {name} done in {timings[name]:.1f}s")

    return _Timer()


def run_demo(config: DemoConfig | None = None, log: Callable[[str], None] = print) -> DemoResult:
    """Run every stage on the tiny default; raises `DraftsmithError` when a stage's gate fails."""
    import torch

    from draftsmith.audit import audit_tokenized
    from draftsmith.evaluate.speculative import evaluate_drafter
    from draftsmith.export.exporter import export_drafter
    from draftsmith.generate import GenerateConfig, generate
    from draftsmith.data.sources import generated_row_files
    from draftsmith.model import DFlashDraftModel, load_drafter
    from draftsmith.plan import make_plan
    from draftsmith.serve.process import ServeProcess
    from draftsmith.tiny import build_tiny_target, synthetic_prompts
    from draftsmith.tokenize import TokenizeOptions, tokenize_dataset
    from draftsmith.train import TrainConfig, train_drafter

    config = config or DemoConfig()
    if config.threads:
        torch.set_num_threads(config.threads)
    work = Path(config.workdir)
    # A demo is a measurement: start clean so every number comes from this run. Only a directory
    # an earlier demo made (it holds the marker) is ever deleted.
    marker = work / ".draftsmith-demo"
    if work.exists() and any(work.iterdir()):
        if not marker.exists():
            raise InputError(f"{work}: not empty and not a demo directory; choose another --workdir")
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    marker.write_text("made by `draftsmith demo`; rerunning the demo replaces this directory\n")
    timings: dict[str, float] = {}

    with _stage("build the tiny target", timings, log):
        target = build_tiny_target(log=log)

    prompts_file = work / "prompts.jsonl"
    eval_file = work / "eval_prompts.jsonl"
    # Held-out evaluation prompts come from another seed, so their ids never meet the training set.
    for path, rows in ((prompts_file, synthetic_prompts(config.train_prompts, seed=config.seed + 1)),
                       (eval_file, synthetic_prompts(config.eval_prompts, seed=config.seed + 1000))):
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))

    with _stage("generate (tiny target served over HTTP, thinking on)", timings, log):
        # Greedy regeneration: the drafter learns exactly what the target says at T=0, which is
        # what the greedy, lossless eval below measures.
        with ServeProcess(["--model", str(target), "--served-model-name", "tiny",
                           "--max-batch-size", str(config.concurrency)]) as server:
            summary = generate(
                GenerateConfig(
                    inputs=[prompts_file],
                    output_dir=work / "generated",
                    endpoints=[server.url],
                    max_tokens=config.max_tokens,
                    temperature=0.0,
                    top_p=None,
                    concurrency=config.concurrency,
                    return_token_ids=True,
                    progress=False,
                ),
                log=log,
            )
        if not summary.ok:
            raise DraftsmithError("demo: generate did not finish cleanly: " + "; ".join(summary.problems()))
        log(f"[demo] generated {summary.done} rows, "
            f"{summary.output_tokens_per_s:,.0f} output tok/s")

    row_files = generated_row_files(work / "generated") or []

    with _stage("tokenize + audit", timings, log):
        tokenized = work / "tokenized"
        tokenize_dataset([work / "generated"], target, tokenized,
                         TokenizeOptions(overwrite=True, progress=False, workers=1))
        report = audit_tokenized(tokenized, tokenizer=str(target))
        log(f"[demo] audit: {report.verdict}")
        if not report.passed:
            raise DraftsmithError(f"demo: the audit failed, not training on this data: {report.verdict}")

    with _stage("plan", timings, log):
        # What the measured rate would mean for the 914k-sample job that motivated draftsmith.
        lengths = [json.loads(line).get("completion_tokens") or 0
                   for path in row_files for line in path.open() if line.strip()]
        plan = make_plan({"samples": 914_000, "output_lengths": lengths,
                          "throughput": f"{summary.output_tokens_per_s:.1f} tok/s"})
        plan_days = plan.to_dict()["wall_time"]["days"]
        log(f"[demo] plan: 914,000 such samples at this rate would take {plan_days:,.1f} days")

    with _stage("train the DFlash drafter (online)", timings, log):
        train_out = work / "train"
        result = train_drafter(
            TrainConfig(
                target=target, data=tokenized, out=train_out, block_size=config.block_size,
                num_draft_layers=config.draft_layers, max_steps=config.train_steps, epochs=1000,
                batch_size=config.batch_size,
                lr=config.lr, seed=config.seed, progress=False, log_every=max(1, config.train_steps // 6),
                num_threads=config.threads,
            )
        )
        log(f"[demo] train: loss {result.first_loss:.3f} -> {result.final_loss:.3f} in {result.steps} steps")

    with _stage("eval: speculative decoding, trained vs untrained drafter", timings, log):
        trained = load_drafter(result.drafter_dir)
        torch.manual_seed(config.seed)
        untrained = DFlashDraftModel(trained.config).eval()
        reports = {
            name: evaluate_drafter(target, drafter, eval_file, max_new_tokens=config.eval_max_new_tokens)
            for name, drafter in (("untrained", untrained), ("trained", trained))
        }
        for name, eval_report in reports.items():
            log(f"[demo] eval {name}: tau {eval_report.tau:.2f}, speed-up {eval_report.speedup:.2f}x, "
                f"lossless {eval_report.lossless}")

    with _stage("export", timings, log):
        export_dir = work / "export"
        export_drafter(result.drafter_dir, export_dir, overwrite=True)

    outcome = DemoResult(
        target_dir=str(target),
        rows_file=str(summary.rows_file),
        tokenized_dir=str(tokenized),
        drafter_dir=str(result.drafter_dir),
        export_dir=str(export_dir),
        generated=summary.done,
        generate_tokens_per_s=summary.output_tokens_per_s,
        audit_verdict=report.verdict,
        plan_days_for_914k=plan_days,
        train_first_loss=result.first_loss,
        train_final_loss=result.final_loss,
        train_steps=result.steps,
        train_seconds=result.elapsed_s,
        tau_trained=reports["trained"].tau,
        tau_untrained=reports["untrained"].tau,
        speedup_trained=reports["trained"].speedup,
        lossless=all(r.lossless for r in reports.values()),
        stage_seconds=timings,
    )
    (work / "demo_result.json").write_text(json.dumps(outcome.to_dict(), indent=2))
    return outcome
