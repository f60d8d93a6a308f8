"""The overfit gate (`draftsmith check --overfit`): what a drafter learned is what the engine serves.

Train a drafter of the export's shape on the target's own greedy answers to many varied prompts,
export it, and decode held-out prompts with draftsmith's in-process speculative decoding and with
the engine serving that export (vLLM's DFlash path). With greedy decoding, the same drafter, the
same target and the same features, both accept the same drafts: per prompt and per draft position,
the engine's accepted counts (its /metrics counters, read around each prompt) must equal
draftsmith's, up to `tolerance` (the share of accepted draft tokens on which they disagree).

A drafter that memorised one answer barely reads the target's features, so a wrong feature would
not show; this one must predict continuations of unseen prompts from them. The gate proves that on
its own drafter before judging an engine: it plants each fault an engine can make (layer ids
shifted by one, the mask token off by one, RoPE theta x100) in a copy of the export, decodes the
held-out prompts in process with it, and requires every fault to move the disagreement to
`min_margin` times the tolerance or more. The verdict names that margin.

Composed here, above the stages, because it runs train, export and evaluate (and the engine in
between). The gate has two halves so a server can be started between them: `prepare_overfit`
(train, export, in-process acceptance and planted faults; resumable from `overfit.json`) and
`engine_verdict` (the engine's acceptance at an endpoint that serves `<work>/export`).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from draftsmith.core.errors import InputError
from draftsmith.core.limits import choose_threads

from draftsmith.gates.config import MIN_MARGIN, TOLERANCE, OverfitConfig  # noqa: F401 (re-exported)

RESULT = "overfit.json"
MARKER = ".draftsmith-overfit"
TRAIN_SEED = 7
HELD_OUT_SEED = 7007  # another seed of the same synthetic tasks: prompts the drafter never saw
FAULTS = ("layer ids shifted", "mask token off by one", "rope theta x100")
# A DSpark export also carries its Markov head; an engine that serves it as plain DFlash drops the bias.
DSPARK_FAULTS = FAULTS + ("markov head dropped",)


def faults_for(settings: dict[str, Any]) -> tuple[str, ...]:
    return DSPARK_FAULTS if settings.get("drafter") == "dspark" else FAULTS


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
    new_tokens: int  # answer tokens trained on (0: the export's own weights, not trained here)
    train_final_loss: float | None
    serve_command: str
    # prompt id -> [cycles, accepted at draft position 1, 2, ...] (counted as vLLM's /metrics counts)
    acceptance: dict[str, list[int]] = field(default_factory=dict)
    # fault -> {"dir", "tau", "disagreement"}: the same drafter with the fault planted, decoded in process
    planted_faults: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def weakest_fault(self) -> tuple[str, float]:
        name = min(self.planted_faults, key=lambda fault: self.planted_faults[fault]["disagreement"])
        return name, self.planted_faults[name]["disagreement"]

    @property
    def margin(self) -> float:
        """How far the weakest planted fault lands beyond the tolerance (fault gap / limit)."""
        return self.weakest_fault[1] / self.settings["tolerance"]

    @property
    def sensitive(self) -> bool:
        return self.margin >= self.settings["min_margin"]


def _settings(export: Path | None, gate: OverfitConfig) -> dict[str, Any]:
    settings: dict[str, Any] = {"train": gate.train, "samples": gate.samples, "steps": gate.steps, "eval_prompts": gate.eval_prompts,
                                "max_new_tokens": gate.max_new_tokens, "tolerance": gate.tolerance,
                                "min_margin": gate.min_margin, "block_size": 16, "num_draft_layers": 1,
                                "target_layer_ids": None, "mask_token_id": None, "drafter": "dflash"}
    if not gate.train:  # the export's own weights: how the gate would have trained does not matter
        settings.update(samples=None, steps=None)
    if export is not None:
        raw = json.loads((export / "config.json").read_text())
        flash = raw.get("dflash_config") or {}
        settings.update(block_size=int(flash.get("block_size", raw.get("block_size", 16))),
                        num_draft_layers=int(raw.get("num_hidden_layers", 1)),
                        target_layer_ids=flash.get("target_layer_ids"), mask_token_id=flash.get("mask_token_id"))
        if raw.get("markov_rank") is not None:  # a DSpark export: the gate trains a DSpark drafter of its shape
            settings.update(drafter="dspark", markov_rank=int(raw["markov_rank"]),
                            confidence_head=bool(raw.get("enable_confidence_head", False)))
    return settings


def plant_fault(export_dir: str | Path, fault: str, out: str | Path) -> Path:
    """A copy of the export whose config.json carries one convention an engine can get wrong."""
    from draftsmith.model.io import MASK_EMBEDDING_NAME

    out = Path(out)
    if out.exists():
        shutil.rmtree(out)
    shutil.copytree(export_dir, out)
    config = json.loads((out / "config.json").read_text())
    flash = config["dflash_config"]
    if fault == "layer ids shifted":
        ids = [int(i) for i in flash["target_layer_ids"]]
        step = 1 if max(ids) + 1 < int(config["num_target_layers"]) else -1
        flash["target_layer_ids"] = [i + step for i in ids]
    elif fault == "mask token off by one":
        if (out / MASK_EMBEDDING_NAME).is_file():
            # The drafter's own mask vector makes any id equivalent (the block is filled with and
            # replaced at the same id); what an engine gets wrong is ignoring the file: eos's row instead.
            (out / MASK_EMBEDDING_NAME).unlink()
            flash.pop("mask_token_source", None)  # so draftsmith's own loader, too, feeds eos's row
        else:
            mask = int(flash["mask_token_id"])
            flash["mask_token_id"] = mask - 1 if mask > 0 else mask + 1
    elif fault == "rope theta x100":
        holders = [holder for holder in (config, config.get("rope_parameters") or {}) if "rope_theta" in holder]
        for holder in holders or [config]:  # no theta written: the loaders' default, 10000
            holder["rope_theta"] = 100 * float(holder.get("rope_theta", 10000.0))
    elif fault == "markov head dropped":
        from safetensors.torch import load_file, save_file

        weights_file = out / "model.safetensors"
        weights = load_file(str(weights_file))
        weights["markov_head.markov_w2.weight"] = weights["markov_head.markov_w2.weight"].zero_()
        save_file(weights, str(weights_file), metadata={"format": "pt"})
    else:
        raise ValueError(f"unknown fault {fault!r}; known: {', '.join(DSPARK_FAULTS)}")
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def acceptance_by_prompt(report) -> dict[str, list[int]]:
    """prompt id -> [cycles, accepted at draft position 1, 2, ...] of an in-process `EvalReport`."""
    return {result.id: [result.cycles, *result.accepted_per_position] for result in report.per_prompt}


def disagreement(reference: dict[str, list[int]], measured: dict[str, list[int]]) -> float:
    """Share of the reference's accepted draft tokens on which `measured` differs, per prompt and position."""
    differ = total = 0
    for prompt, counts in reference.items():
        mine, theirs = counts[1:], measured.get(prompt, [0])[1:]
        width = max(len(mine), len(theirs))
        mine, theirs = mine + [0] * (width - len(mine)), theirs + [0] * (width - len(theirs))
        differ += sum(abs(a - b) for a, b in zip(mine, theirs))
        total += sum(mine)
    if not total:  # nothing accepted to compare against: only a measured acceptance differs
        return float("inf") if differ else 0.0
    return differ / total


def _training_rows(target, tokenizer, prompts: list[dict], max_new_tokens: int) -> list[dict]:
    """The target's own greedy answers: the drafter learns what the target says, as it will be asked."""
    import torch

    from draftsmith.data.prompts import generation_prompt_ids
    from draftsmith.evaluate import greedy_decode

    from draftsmith.model.speculative import default_stop_token_ids

    stop = default_stop_token_ids(target, tokenizer)
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


def _prompts(count: int, seed: int) -> list[dict]:
    from draftsmith.tiny import synthetic_prompts

    return [{"id": row["id"], "messages": row["messages"]} for row in synthetic_prompts(count, seed=seed)]


def _train_and_export(target, tokenizer, target_dir: Path, work: Path, settings: dict[str, Any], lr: float, log,
                      threads: int | None = None):
    from draftsmith.data.tokenized import write_tokenized
    from draftsmith.export.exporter import export_drafter
    from draftsmith.train import TrainConfig, train_drafter

    rows = _training_rows(target, tokenizer, _prompts(settings["samples"], TRAIN_SEED), settings["max_new_tokens"])
    write_tokenized(rows, work / "tokenized")
    new_tokens = sum(sum(row["loss_mask"]) for row in rows)
    log(f"[overfit] {len(rows)} training prompts, {new_tokens} answer tokens; training {settings['steps']} steps")
    train_config = TrainConfig(
        target=target_dir, data=work / "tokenized", out=work / "train", block_size=settings["block_size"],
        num_draft_layers=settings["num_draft_layers"], target_layer_ids=settings["target_layer_ids"],
        mask_token_id=settings["mask_token_id"], max_steps=settings["steps"], epochs=10_000,
        batch_size=min(4, len(rows)), lr=lr, seed=0, progress=False, log_every=max(1, settings["steps"] // 4),
        num_threads=threads,
        **({"drafter": "dspark", "markov_rank": settings["markov_rank"], "confidence_head": settings["confidence_head"]}
           if settings.get("drafter") == "dspark" else {}),
    )
    with contextlib.redirect_stdout(sys.stderr):  # `check`'s stdout carries its report only
        result = train_drafter(train_config)
    return export_drafter(result.drafter_dir, work / "export", overwrite=True), new_tokens, result.final_loss


def prepare_overfit(target_dir: str | Path, work: str | Path, export: str | Path | None = None,
                    lr: float = 5e-3, log: Callable[[str], None] = lambda _: None, **options) -> OverfitPrepared:
    """Train on many target answers, export to `<work>/export`, measure the in-process acceptance on
    held-out prompts, plain and with each planted fault. `options` are `OverfitConfig` fields
    (samples, steps, eval_prompts, max_new_tokens, tolerance, min_margin)."""
    import torch
    from transformers import AutoTokenizer

    from draftsmith.evaluate import evaluate_drafter
    from draftsmith.export.exporter import serving_commands
    from draftsmith.model import load_drafter_config
    from draftsmith.model.target import load_target_model

    work, target_dir = Path(work), Path(target_dir)
    gate = OverfitConfig(target=target_dir, work=work, **options)
    settings = _settings(Path(export) if export else None, gate)
    done = work / RESULT
    if done.is_file():
        previous = json.loads(done.read_text())
        if previous.get("settings") == settings and previous.get("target") == str(target_dir):
            log(f"[overfit] reusing {work} (same settings)")
            return OverfitPrepared(**previous)
    _fresh_work_dir(work)
    held_out = _prompts(settings["eval_prompts"], HELD_OUT_SEED)
    prompts_file = work / "prompts.jsonl"
    prompts_file.write_text("".join(json.dumps(row) + "\n" for row in held_out))
    threads, threads_line = choose_threads(gate.threads)  # the gate decodes and trains on the CPU
    log(f"[overfit] {threads_line}")
    tokenizer = AutoTokenizer.from_pretrained(str(target_dir))
    target = load_target_model(target_dir, "cpu", torch.float32)
    if settings["train"]:
        exported, new_tokens, final_loss = _train_and_export(target, tokenizer, target_dir, work, settings, lr, log,
                                                             threads)
    else:
        if export is None:
            raise InputError("the overfit gate without training judges the export's own weights: give the export")
        from draftsmith.export.exporter import export_drafter

        log(f"[overfit] judging {export}'s own weights (not trained here)")
        exported, new_tokens, final_loss = export_drafter(export, work / "export", overwrite=True), 0, None

    def decode(drafter_dir: Path):
        return evaluate_drafter(target, drafter_dir, held_out, max_new_tokens=settings["max_new_tokens"],
                                tokenizer=tokenizer)

    report = decode(exported.path)
    acceptance = acceptance_by_prompt(report)
    planted = {}
    for fault in faults_for(settings):
        faulty = plant_fault(exported.path, fault, work / "planted" / fault.replace(" ", "-"))
        faulty_report = decode(faulty)
        planted[fault] = {"dir": str(faulty), "tau": faulty_report.tau_engine_counting,
                          "disagreement": disagreement(acceptance, acceptance_by_prompt(faulty_report))}
        log(f"[overfit] planted {fault}: in-process tau {faulty_report.tau_engine_counting:.2f}, "
            f"disagreement {planted[fault]['disagreement']:.1%}")
    config = load_drafter_config(exported.path)
    prepared = OverfitPrepared(
        work=str(work), export_dir=str(exported.path), prompts_file=str(prompts_file), target=str(target_dir),
        block_size=int(config.block_size), settings=settings, in_process_tau=report.tau,
        in_process_tau_engine_counting=report.tau_engine_counting, new_tokens=new_tokens, train_final_loss=final_loss,
        serve_command=serving_commands(config, exported.path.resolve(), str(target_dir.resolve()))["vllm"],
        acceptance=acceptance, planted_faults=planted,
    )
    done.write_text(json.dumps(asdict(prepared), indent=2) + "\n")
    log(f"[overfit] in-process tau {report.tau:.2f} on {len(held_out)} held-out prompts (block size "
        f"{prepared.block_size}); weakest planted fault {prepared.weakest_fault[0]}: margin {prepared.margin:.1f}x")
    return prepared


def engine_acceptance(endpoint: str, prompts_file: str | Path, max_new_tokens: int) -> dict[str, list[int]]:
    """prompt id -> [verify steps, accepted at draft position 1, 2, ...] from the engine's counters,
    read around each prompt sent alone."""
    from draftsmith.evaluate import evaluate_endpoint

    rows = [json.loads(line) for line in Path(prompts_file).read_text().splitlines() if line.strip()]
    measured = {}
    for row in rows:
        report = evaluate_endpoint(endpoint, [row], max_new_tokens=max_new_tokens)
        measured[row["id"]] = [report.num_drafts, *report.accepted_per_position]
    return measured


def engine_verdict(prepared: OverfitPrepared, endpoint: str) -> dict[str, Any]:
    """Whether the engine at `endpoint` accepts, per held-out prompt and draft position, what draftsmith does."""
    measured = engine_acceptance(endpoint, prepared.prompts_file, prepared.settings["max_new_tokens"])
    gap = disagreement(prepared.acceptance, measured)
    tolerance = prepared.settings["tolerance"]
    steps = sum(counts[0] for counts in measured.values())
    engine_tau = 1 + sum(sum(counts[1:]) for counts in measured.values()) / steps if steps else 0.0
    same = sum(measured.get(prompt) == counts for prompt, counts in prepared.acceptance.items())
    weakest, weakest_gap = prepared.weakest_fault
    passed = prepared.sensitive and gap <= tolerance
    measured_line = (f"engine and in-process disagree on {gap:.1%} of accepted draft tokens (limit {tolerance:.0%}; "
                     f"{same}/{len(prepared.acceptance)} held-out prompts identical per position; engine tau "
                     f"{engine_tau:.2f} vs in-process {prepared.in_process_tau_engine_counting:.2f})")
    if not prepared.sensitive:
        verdict = (f"FAIL: inconclusive: planted {weakest} moves draftsmith's own acceptance by only "
                   f"{weakest_gap:.1%} (needs {prepared.settings['min_margin']:g}x the {tolerance:.0%} limit), so the "
                   f"gate's drafter cannot show a wrong convention; train longer (--overfit-steps) or on more "
                   f"samples (--overfit-samples); {measured_line}")
    else:
        verdict = (f"{'PASS' if passed else 'FAIL'}: {measured_line}; the weakest planted fault ({weakest}) "
                   f"disagrees on {weakest_gap:.1%} in process, margin {prepared.margin:.1f}x the limit")
        if not passed:
            verdict += "; the engine serves another drafter than the one trained (run `draftsmith check` on the export)"
    return {"passed": passed, "verdict": verdict, "disagreement": gap, "tolerance": tolerance,
            "prompts_identical": same, "prompts": len(prepared.acceptance), "engine_tau": engine_tau,
            "in_process_tau": prepared.in_process_tau, "in_process_tau_engine_counting":
            prepared.in_process_tau_engine_counting, "margin": prepared.margin,
            "planted_faults": {name: {"tau": fault["tau"], "disagreement": fault["disagreement"]}
                               for name, fault in prepared.planted_faults.items()},
            "engine_acceptance": measured, "engine_verify_steps": steps, "endpoint": endpoint,
            "export_dir": prepared.export_dir}


def run_overfit_gate(config, summary, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """`check --overfit`: prepare (or reuse) the gate's export; with --endpoint, also judge the engine."""
    from draftsmith.core.lock import lock_directory

    log = log or (lambda message: print(message, file=sys.stderr))
    gate = OverfitConfig.from_check(config)
    options = gate.model_dump(exclude={"target", "export", "work", "endpoint"})
    with lock_directory(gate.work, "check --overfit"):
        prepared = prepare_overfit(gate.target, gate.work, export=gate.export, log=log, **options)
    if gate.endpoint is None:
        return {"passed": None, "in_process_tau": prepared.in_process_tau, "export_dir": prepared.export_dir,
                "serve_command": prepared.serve_command, "margin": prepared.margin,
                "verdict": (f"not judged yet: in-process tau {prepared.in_process_tau:.2f} on "
                            f"{len(prepared.acceptance)} held-out prompts (block size {prepared.block_size}), planted "
                            f"faults {prepared.margin:.1f}x beyond the limit; serve the gate's export with "
                            f"`{prepared.serve_command}` and rerun with --endpoint URL")}
    return engine_verdict(prepared, gate.endpoint)
