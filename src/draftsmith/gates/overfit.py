"""The overfit gate (`draftsmith check --overfit`): what a drafter learned is what the engine serves.

Train a drafter of the export's shape on one sample (or a few) until draftsmith's own speculative
decoding accepts nearly whole blocks on it, export it, serve it through vLLM's DFlash path and
require the engine's tau on that sample within 10% of the in-process tau. Any convention that
differs between draftsmith and the engine (layer ids, the feature, mask token, heads, RoPE, block
size) makes the engine's tau fall, so this catches what the static checks cannot name.

Composed here, above the stages, because it runs five of them (train, export, evaluate twice, and
the engine in between). The gate has two halves so a server can be started between them:
`prepare_overfit` (train, export, in-process tau; resumable from `overfit.json`) and
`engine_verdict` (the engine's tau at an endpoint that serves `<work>/export`).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

from draftsmith.core.errors import InputError

from draftsmith.gates.config import MIN_FRACTION, TOLERANCE, OverfitConfig  # noqa: F401 (TOLERANCE, MIN_FRACTION re-exported)

RESULT = "overfit.json"
MARKER = ".draftsmith-overfit"


@dataclass
class OverfitPrepared:
    work: str
    export_dir: str
    prompts_file: str
    target: str
    block_size: int
    settings: dict[str, Any]
    in_process_tau: float
    in_process_tau_engine_counting: float
    new_tokens: int
    train_final_loss: float
    serve_command: str

    @property
    def overfit(self) -> bool:
        return self.in_process_tau >= MIN_FRACTION * self.block_size


def _settings(export: Path | None, samples: int, steps: int, max_new_tokens: int) -> dict[str, Any]:
    settings: dict[str, Any] = {"samples": samples, "steps": steps, "max_new_tokens": max_new_tokens,
                                "block_size": 16, "num_draft_layers": 1, "target_layer_ids": None, "mask_token_id": None}
    if export is not None:
        raw = json.loads((export / "config.json").read_text())
        flash = raw.get("dflash_config") or {}
        settings.update(block_size=int(flash.get("block_size", raw.get("block_size", 16))),
                        num_draft_layers=int(raw.get("num_hidden_layers", 1)),
                        target_layer_ids=flash.get("target_layer_ids"), mask_token_id=flash.get("mask_token_id"))
    return settings


def _training_rows(target, tokenizer, prompts: list[dict], max_new_tokens: int) -> list[dict]:
    """The target's own greedy answers: the drafter learns exactly what it will be asked to draft."""
    import torch

    from draftsmith.data.prompts import generation_prompt_ids
    from draftsmith.evaluate import greedy_decode

    stop = [int(tokenizer.eos_token_id)] if tokenizer.eos_token_id is not None else []
    rows = []
    for prompt in prompts:
        ids = generation_prompt_ids(tokenizer, prompt["messages"])
        answer = greedy_decode(target, torch.tensor([ids]), max_new_tokens, stop).tokens
        rows.append({"id": prompt["id"], "input_ids": ids + answer, "loss_mask": [0] * len(ids) + [1] * len(answer),
                     "finish_reason": "stop" if answer and answer[-1] in stop else "length"})
    return rows


def _fresh_work_dir(work: Path) -> None:
    from draftsmith.core.lock import LOCK_NAME, OWNER_NAME

    work.mkdir(parents=True, exist_ok=True)
    entries = [entry for entry in work.iterdir() if entry.name not in (LOCK_NAME, OWNER_NAME)]
    if entries and not (work / MARKER).exists():
        raise InputError(f"{work}: not empty and not an overfit-gate directory; choose another --overfit-dir")
    for entry in entries:
        shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    (work / MARKER).write_text("made by `draftsmith check --overfit`; rerunning with other settings replaces it\n")


def prepare_overfit(target_dir: str | Path, work: str | Path, export: str | Path | None = None, samples: int = 1,
                    steps: int = 200, max_new_tokens: int = 64, lr: float = 5e-3,
                    log: Callable[[str], None] = lambda _: None) -> OverfitPrepared:
    """Train on `samples` target answers, export to `<work>/export`, measure the in-process tau."""
    import torch
    from transformers import AutoTokenizer

    from draftsmith.data.tokenized import write_tokenized
    from draftsmith.evaluate import evaluate_drafter
    from draftsmith.export.exporter import export_drafter, serving_commands
    from draftsmith.model import load_drafter_config
    from draftsmith.model.target import load_target_model
    from draftsmith.tiny import synthetic_prompts
    from draftsmith.train import TrainConfig, train_drafter

    work, target_dir = Path(work), Path(target_dir)
    settings = _settings(Path(export) if export else None, samples, steps, max_new_tokens)
    done = work / RESULT
    if done.is_file():
        previous = json.loads(done.read_text())
        if previous.get("settings") == settings and previous.get("target") == str(target_dir):
            log(f"[overfit] reusing {work} (same settings)")
            return OverfitPrepared(**previous)
    _fresh_work_dir(work)
    prompts = [{"id": row["id"], "messages": row["messages"]} for row in synthetic_prompts(samples, seed=7)]
    prompts_file = work / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps(row) + "\n" for row in prompts))
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    target = load_target_model(target_dir, "cpu", torch.float32)
    rows = _training_rows(target, tokenizer, prompts, max_new_tokens)
    write_tokenized(rows, work / "tokenized")
    log(f"[overfit] {samples} sample(s), {sum(sum(r['loss_mask']) for r in rows)} answer tokens; training {steps} steps")
    train_config = TrainConfig(
        target=target_dir, data=work / "tokenized", out=work / "train", block_size=settings["block_size"],
        num_draft_layers=settings["num_draft_layers"], target_layer_ids=settings["target_layer_ids"],
        mask_token_id=settings["mask_token_id"], max_steps=steps, epochs=steps, batch_size=samples, lr=lr,
        warmup_ratio=0.0, progress=False, log_every=max(1, steps // 4), seed=0,
    )
    with contextlib.redirect_stdout(sys.stderr):  # `check`'s stdout carries its report only
        result = train_drafter(train_config)
    exported = export_drafter(result.drafter_dir, work / "export", overwrite=True)
    report = evaluate_drafter(target, exported.path, prompts_file, max_new_tokens=max_new_tokens, tokenizer=tokenizer)
    config = load_drafter_config(exported.path)
    prepared = OverfitPrepared(
        work=str(work), export_dir=str(exported.path), prompts_file=str(prompts_file), target=str(target_dir),
        block_size=int(config.block_size), settings=settings, in_process_tau=report.tau,
        in_process_tau_engine_counting=report.tau_engine_counting, new_tokens=sum(sum(r["loss_mask"]) for r in rows),
        train_final_loss=result.final_loss,
        serve_command=serving_commands(config, exported.path.resolve(), str(target_dir.resolve()))["vllm"],
    )
    done.write_text(json.dumps(asdict(prepared), indent=2) + "\n")
    log(f"[overfit] in-process tau {report.tau:.2f} (block size {prepared.block_size})")
    return prepared


def engine_verdict(prepared: OverfitPrepared, endpoint: str) -> dict[str, Any]:
    """The engine's tau on the overfit sample(s) at `endpoint`, and whether it is within 10%."""
    from draftsmith.evaluate import evaluate_endpoint

    engine = evaluate_endpoint(endpoint, prepared.prompts_file, max_new_tokens=prepared.settings["max_new_tokens"])
    # vLLM counts drafts accepted past the end of an answer too; compare like with like.
    ours = prepared.in_process_tau_engine_counting
    gap = abs(engine.tau - ours) / ours if ours else float("inf")
    passed = prepared.overfit and gap <= TOLERANCE
    if not prepared.overfit:
        verdict = (f"FAIL: draftsmith's own tau {prepared.in_process_tau:.2f} never reached "
                   f"{MIN_FRACTION * prepared.block_size:.1f} (half the block size); train longer (--overfit-steps)")
    else:
        verdict = (f"{'PASS' if passed else 'FAIL'}: engine tau {engine.tau:.2f} vs in-process tau {ours:.2f} "
                   f"({gap:.1%} apart, limit {TOLERANCE:.0%}; block size {prepared.block_size})")
        if not passed:
            verdict += ": the engine serves another drafter than the one trained (run `draftsmith check` on the export)"
    return {"passed": passed, "verdict": verdict, "engine_tau": engine.tau, "in_process_tau": prepared.in_process_tau,
            "in_process_tau_engine_counting": ours, "gap": gap, "tolerance": TOLERANCE, "endpoint": engine.endpoint,
            "engine_verify_steps": engine.num_drafts, "export_dir": prepared.export_dir,
            "thinking_mode": engine.thinking_mode}


def run_overfit_gate(config, summary, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """`check --overfit`: prepare (or reuse) the gate's export; with --endpoint, also judge the engine."""
    import sys

    from draftsmith.core.lock import lock_directory

    log = log or (lambda message: print(message, file=sys.stderr))
    gate = OverfitConfig.from_check(config)
    with lock_directory(gate.work, "check --overfit"):
        prepared = prepare_overfit(gate.target, gate.work, export=gate.export, samples=gate.samples,
                                   steps=gate.steps, max_new_tokens=gate.max_new_tokens, log=log)
    if gate.endpoint is None:
        return {"passed": None, "in_process_tau": prepared.in_process_tau, "export_dir": prepared.export_dir,
                "serve_command": prepared.serve_command,
                "verdict": (f"not judged yet: in-process tau {prepared.in_process_tau:.2f} (block size "
                            f"{prepared.block_size}); serve the gate's export with `{prepared.serve_command}` and "
                            "rerun with --endpoint URL")}
    return engine_verdict(prepared, gate.endpoint)
