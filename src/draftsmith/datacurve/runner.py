"""`plan data`: train the recipe on nested subsets, measure held-out tau, fit, predict, plan.

Composes train, evaluate and plan, so it sits above the stages (like the demo and the gates).
Every subset's drafter is an ordinary `train` run directory under <out>/runs/; its held-out
measurement is written beside it (`curve_eval.json`), so a rerun reuses what finished, resumes a run
that was stopped (`--max-minutes`, a kill) and trains only what is missing.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from draftsmith.core.errors import InputError
from draftsmith.core.io import write_json_atomic
from draftsmith.core.lock import lock_directory
from draftsmith.datacurve.config import DataCurveConfig
from draftsmith.datacurve.fit import (
    METHODS,
    Measurement,
    bootstrap_fits,
    compare_methods,
    fit_curve,
    measured_tau,
    predict_with_interval,
    smallest_size_reaching,
    support_limit,
)
from draftsmith.datacurve.summary import CurveRow, DataCurveSummary, PlanRow, SmokeVerdict, write_plot

EVAL_FILE = "curve_eval.json"
#: The runs a curve will train, written before the first one starts: what `draftsmith status` counts against.
RUNS_FILE = "curve_runs.json"
SUBSET_SEED_OFFSET = 7919  # the subsets' order is its own stream, not the drafter's initialisation


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def resolve_sizes(config: DataCurveConfig, available: int) -> list[int]:
    """The subset sizes, checked: increasing, within the data, each at least one optimizer step's samples."""
    if config.sizes:
        sizes = list(config.sizes)
        where = "--sizes"
    else:
        fractions = list(config.fractions)
        if any(not (0 < f <= 1) or not math.isfinite(f) for f in fractions):
            raise InputError(f"--fractions must each be in (0, 1], got {fractions}")
        sizes = [max(1, int(round(f * available))) for f in fractions]
        where = f"--fractions of {available:,} samples"
    if any(b <= a for a, b in zip(sizes, sizes[1:])):
        raise InputError(f"{where}: subset sizes must be strictly increasing, got {sizes}")
    if sizes[-1] > available:
        raise InputError(f"{where}: the largest subset ({sizes[-1]:,}) is more than the data holds ({available:,} samples in {config.data})")
    step = config.batch_size * config.grad_accum
    if sizes[0] < step:
        raise InputError(f"{where}: the smallest subset ({sizes[0]}) is smaller than one optimizer step "
                         f"(--batch-size {config.batch_size} x --grad-accum {config.grad_accum})")
    if config.smoke:
        sizes = sizes[:1]
    elif len(sizes) < 2:
        raise InputError(f"{where}: a curve needs at least two subset sizes (or --smoke for one), got {sizes}")
    return sizes


def check_config(config: DataCurveConfig) -> None:
    if config.max_steps is not None:
        raise InputError("plan data: --max-steps is not a curve setting: every subset trains --epochs passes, so steps grow with it")
    if config.benchmark_steps is not None:
        raise InputError("plan data: --benchmark-steps times one run; use `train --benchmark-steps`")
    if config.eval_prompts is None:
        raise InputError("plan data needs --eval-prompts FILE: held-out prompts every subset's drafter is measured on")
    if config.target_tau is not None and config.target_tau > config.block_size:
        raise InputError(f"--target-tau {config.target_tau:g} is above what a block of {config.block_size} can reach "
                         f"(tau counts at most {config.block_size} tokens per step)")
    if config.per_gpu and config.throughput:
        raise InputError("give --per-gpu (with --gpus) or --throughput, not both")


def _held_out_prompts(config: DataCurveConfig, train_ids: set[str]):
    from draftsmith.evaluate.prompts import read_prompts

    prompts = read_prompts(config.eval_prompts, limit=config.eval_limit)
    overlap = sorted({prompt.id for prompt in prompts} & train_ids)
    if overlap:
        raise InputError(f"{config.eval_prompts}: {len(overlap)} of {len(prompts)} held-out prompts are training samples "
                         f"of {config.data} (ids {', '.join(overlap[:3])}{', ...' if len(overlap) > 3 else ''}); "
                         "a curve measured on training prompts says nothing about new data")
    return prompts


def _write_subset(dataset, order: np.ndarray, size: int, directory: Path) -> None:
    """The first `size` samples of the fixed order: nested by construction. Written once, then reused."""
    from draftsmith.data.tokenized import write_tokenized

    marker = directory / "subset.json"
    expected = {"size": size, "source_fingerprint": dataset.fingerprint()}
    if marker.is_file():
        try:
            if json.loads(marker.read_text()) == expected:
                return
        except (OSError, ValueError):
            pass
    staging = directory.with_name(directory.name + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    rows = ({"id": sample.id, "input_ids": np.asarray(sample.input_ids), "loss_mask": np.asarray(sample.loss_mask)}
            for sample in (dataset[int(index)] for index in order[:size]))
    write_tokenized(rows, staging)
    write_json_atomic(staging / "subset.json", expected)
    shutil.rmtree(directory, ignore_errors=True)
    staging.rename(directory)


def _train_config(config: DataCurveConfig, size: int, seed: int, minutes_left: float | None):
    from draftsmith.train.config import TrainConfig

    # Only what the curve was given: train refuses another variant's or loss's settings when they are set.
    values = {name: getattr(config, name) for name in TrainConfig.model_fields if name in config.model_fields_set}
    run_dir = config.run_dir(size, seed)
    values.update(data=config.subset_dir(size), out=run_dir, seed=seed, eval_prompts=None, progress=False,
                  resume=(run_dir / "checkpoints").is_dir(), max_minutes=minutes_left, force_resume=False)
    return TrainConfig(**values)


def _finished(run_dir: Path) -> bool:
    summary = run_dir / "train_summary.json"
    if not summary.is_file():
        return False
    try:
        data = json.loads(summary.read_text())
    except (OSError, ValueError):
        return False
    return not data.get("extra", {}).get("stopped_by_max_minutes") and (run_dir / "drafter").is_dir()


def _measurement(size: int, seed: int, report) -> Measurement:
    width = len(report.per_position_acceptance_engine_counting) or report.block_size - 1
    cycles = np.array([item.cycles for item in report.per_prompt], dtype=float)
    accepted = np.zeros((len(report.per_prompt), width))
    for row, item in enumerate(report.per_prompt):
        counts = item.accepted_per_position[:width]
        accepted[row, : len(counts)] = counts
    return Measurement(size=size, seed=seed, cycles=cycles, accepted=accepted)


def _load_measurement(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _as_measurement(record: dict[str, Any]) -> Measurement:
    return Measurement(size=record["size"], seed=record["seed"], cycles=np.asarray(record["cycles"], dtype=float),
                       accepted=np.asarray(record["accepted"], dtype=float))


# What a subset's run may differ in from another curve's and still be reused: where it lives, how it reports.
_NOT_RECIPE = {"data", "out", "seed", "resume", "force_resume", "progress", "max_minutes", "eval_prompts", "log_every",
               "report_to", "data_workers", "num_threads", "allow_partial", "keep_checkpoints", "save_every"}


def recipe_of(config: DataCurveConfig) -> dict[str, Any]:
    """The train settings that make a subset's drafter what it is (a rerun with other ones trains anew)."""
    from draftsmith.train.config import TrainConfig

    return {name: json.loads(json.dumps(getattr(config, name), default=str))
            for name in TrainConfig.model_fields if name not in _NOT_RECIPE}


def _check_same_recipe(config: DataCurveConfig, record: dict[str, Any], where: Path) -> None:
    ours = {**recipe_of(config), "eval_prompts": str(config.eval_prompts), "eval_limit": config.eval_limit}
    theirs = record.get("recipe", {})
    changed = sorted(key for key in set(ours) | set(theirs) if ours.get(key) != theirs.get(key))
    if changed:
        raise InputError(f"{where}: this curve was measured with other settings ({', '.join(changed[:6])} differ); "
                         "give another --out, or the same settings to continue it")


def _record(config: DataCurveConfig, size: int, seed: int, steps: int, report, baselines: dict[str, float]) -> dict[str, Any]:
    item = _measurement(size, seed, report)
    return {"recipe": {**recipe_of(config), "eval_prompts": str(config.eval_prompts), "eval_limit": config.eval_limit},
            "size": size, "seed": seed, "steps": steps, "tau": report.tau, "tau_engine_counting": report.tau_engine_counting,
            "per_position_acceptance": report.per_position_acceptance_engine_counting, "lossless": report.lossless,
            "prompts": report.num_prompts, "cycles": item.cycles.tolist(), "accepted": item.accepted.tolist(),
            "baselines": baselines}


def _evaluate(config: DataCurveConfig, drafter_dir: Path, prompts, with_baselines: bool):
    from draftsmith.evaluate.speculative import evaluate_drafter

    return evaluate_drafter(config.target, drafter_dir, prompts, max_new_tokens=config.eval_max_new_tokens,
                            baselines=("ngram", "untrained") if with_baselines else (), seed=config.seed)


class _Clock:
    """Progress across the whole curve: runs done, steps done, and an ETA from the seconds per step so far."""

    def __init__(self, planned_steps: list[int]):
        self.planned = planned_steps
        self.done_steps = 0
        self.trained_seconds = 0.0
        self.started = time.perf_counter()

    def finished_run(self, steps: int, seconds: float) -> None:
        self.done_steps += steps
        self.trained_seconds += seconds

    def eta(self, remaining_steps: int) -> str:
        if not self.done_steps:
            return "ETA unknown until the first run finishes"
        seconds = remaining_steps * self.trained_seconds / self.done_steps
        return f"ETA {seconds / 60:.1f} min of training left"


def plan_data(config: DataCurveConfig, log: Callable[[str], None] = _log) -> DataCurveSummary:
    """Measure tau on nested subsets of `config.data`, fit the curve, predict and join it to the plan."""
    from draftsmith.data.tokenized import load_tokenized

    check_config(config)
    dataset = load_tokenized(config.data, max_length=config.max_length, split=config.split)
    sizes = resolve_sizes(config, len(dataset))
    train_ids = {dataset[index].id for index in range(len(dataset))}
    prompts = _held_out_prompts(config, train_ids)
    config.out.mkdir(parents=True, exist_ok=True)
    with lock_directory(config.out, "plan data"):
        return _run(config, dataset, sizes, prompts, log)


def _steps(config: DataCurveConfig, size: int) -> int:
    from draftsmith.train.loader import steps_per_epoch

    return steps_per_epoch(size, 1, config.batch_size, config.grad_accum) * config.epochs


def _run(config: DataCurveConfig, dataset, sizes: list[int], prompts, log) -> DataCurveSummary:
    order = np.random.default_rng(config.seed + SUBSET_SEED_OFFSET).permutation(len(dataset))
    seeds = [config.seed + offset for offset in range(config.seeds)]
    runs = [(size, seed) for size in sizes for seed in seeds]
    clock = _Clock([_steps(config, size) for size, _ in runs])
    deadline = None if config.max_minutes is None else time.perf_counter() + 60 * config.max_minutes
    log(f"[plan data] {len(sizes)} subset(s) {', '.join(f'{s:,}' for s in sizes)} of {len(dataset):,} samples x "
        f"{len(seeds)} seed(s), {config.epochs} epoch(s) each (steps grow with the subset: "
        f"{', '.join(f'{_steps(config, s):,}' for s in sizes)}); held-out prompts: {len(prompts)}")
    write_json_atomic(config.out / RUNS_FILE, {
        "kind": "draftsmith.plan.data.runs", "version": 1, "epochs": config.epochs,
        "runs": [{"size": size, "seed": seed, "steps": _steps(config, size),
                  "dir": str(config.run_dir(size, seed).relative_to(config.out))} for size, seed in runs],
    }, indent=1)  # fmt: skip
    records: list[dict[str, Any]] = []
    baselines: dict[str, float] = {}
    stopped = False
    for index, (size, seed) in enumerate(runs):
        run_dir = config.run_dir(size, seed)
        record = _load_measurement(run_dir / EVAL_FILE)
        if record is not None:
            _check_same_recipe(config, record, run_dir / EVAL_FILE)
        if record is not None and _finished(run_dir):
            log(f"[plan data] run {index + 1}/{len(runs)}: n={size:,} seed {seed}: reused (tau {record['tau']:.2f})")
            records.append(record)
            baselines = baselines or record.get("baselines", {})
            continue
        minutes_left = None if deadline is None else (deadline - time.perf_counter()) / 60
        if minutes_left is not None and minutes_left <= 0:
            stopped = True
            break
        _write_subset(dataset, order, size, config.subset_dir(size))
        remaining = sum(clock.planned[index:])
        log(f"[plan data] run {index + 1}/{len(runs)}: n={size:,} seed {seed}: training {_steps(config, size):,} steps; {clock.eta(remaining)}")
        from draftsmith.train.trainer import train_drafter

        started = time.perf_counter()
        result = train_drafter(_train_config(config, size, seed, minutes_left))
        clock.finished_run(result.steps - (result.resumed_from_step or 0), time.perf_counter() - started)
        if result.extra.get("stopped_by_max_minutes"):
            stopped = True
            break
        report = _evaluate(config, result.drafter_dir, prompts, with_baselines=not baselines)
        if not baselines:
            baselines = {item.method: item.tau_engine_counting for item in report.baselines}
        record = _record(config, size, seed, result.steps, report, baselines)
        write_json_atomic(run_dir / EVAL_FILE, record)
        log(f"[plan data] n={size:,} seed {seed}: held-out tau {report.tau:.2f}, lossless {report.lossless}")
        records.append(record)
    summary = summarize(config, len(dataset), _mean_tokens(dataset), sizes, records, baselines, stopped, log)
    _publish(config, summary, log)
    return summary


def _publish(config: DataCurveConfig, summary: DataCurveSummary, log) -> None:
    if config.plot and summary.curve_points:
        try:
            summary.plot_file = str(write_plot(summary, config.out / "curve.png"))
        except ImportError:
            log("[plan data] no plot: matplotlib is missing (pip install 'draftsmith[plot]')")
    write_json_atomic(config.out / "curve.json", summary.to_dict(), indent=1)


def _mean_tokens(dataset) -> tuple[float, float]:
    """(output tokens, all tokens) per sample: what regeneration writes (the trained completion) and what training reads."""
    return float(np.mean(dataset.trainable_counts)), float(np.mean(dataset.lengths))


def summarize(config: DataCurveConfig, available: int, mean_tokens: tuple[float, float], sizes: list[int], records: list[dict[str, Any]],
              baselines: dict[str, float], stopped: bool, log=_log) -> DataCurveSummary:
    """From the measurements to the curve, the predictions and the plan rows (also usable on saved records)."""
    output_mean, sequence_mean = mean_tokens
    measurements = [_as_measurement(record) for record in records]
    measured = measured_tau(measurements) if measurements else {}
    rows = [CurveRow(size=size, steps=_steps(config, size),
                     seeds=[r["seed"] for r in records if r["size"] == size],
                     tau=[r["tau_engine_counting"] for r in records if r["size"] == size],
                     per_position=np.mean([r["per_position_acceptance"] for r in records if r["size"] == size], axis=0).tolist()
                     if any(r["size"] == size for r in records) else [],
                     lossless=all(r["lossless"] is not False for r in records if r["size"] == size))
            for size in sizes]
    summary = DataCurveSummary(out=str(config.out), available_samples=available, sizes=sizes, epochs=config.epochs,
                               rows=rows, baselines=baselines, stopped_early=stopped, output_mean=output_mean, sequence_mean=sequence_mean,
                               support_limit=support_limit(sizes) if len(sizes) > 1 else float(sizes[0]))
    summary.smoke = _smoke_verdict(config, records, rows, baselines)
    complete = [size for size in sizes if measured.get(size) is not None]
    if stopped or len(complete) < 2:
        summary.note = ("stopped by --max-minutes: rerun the same command to continue" if stopped
                        else "one subset measured: no curve (the pass bar above is the smoke run's answer)")
        return summary
    checks = compare_methods(measurements, config.block_size)
    if checks:
        summary.method_checks = [{"method": c.method, "predicted": c.predicted, "measured": c.measured, "error": c.error} for c in checks]
        method = min(checks, key=lambda c: c.error).method
        summary.method_reason = (f"{method} predicted the largest subset ({max(complete):,}) from the smaller ones best "
                                 f"({', '.join(f'{c.method} {c.error:.1%} off' for c in checks)})")
    else:
        method = "positions"
        summary.method_reason = "two sizes cannot judge the methods against each other: per-position fit by default"
    fit = fit_curve(method, measurements, config.block_size)
    replicas = bootstrap_fits(method, measurements, config.block_size, replicates=config.bootstrap, seed=config.seed) if config.bootstrap else []
    summary.method = method
    summary.fit = fit.to_dict()
    plateau = fit.plateau()
    wanted: list[tuple[str, int]] = [("measured", size) for size in complete]
    if available > max(complete):
        wanted.append(("all data", available))
    planned = _planned_samples(config)
    if planned:
        wanted.append(("planned (--samples)", planned))
    if config.target_tau is not None:
        summary.target_tau = config.target_tau
        reach = smallest_size_reaching(fit, config.target_tau)
        summary.target_reached_at = reach
        if reach is not None:
            wanted.append((f"reaches tau {config.target_tau:g}", reach))
    near_plateau = smallest_size_reaching(fit, 0.95 * plateau)
    if near_plateau is not None:
        wanted.append(("95% of the plateau", near_plateau))
    predictions = predict_with_interval(fit, replicas, [n for _, n in wanted])
    summary.curve_points = _curve_points(fit, replicas, sizes, max(n for _, n in wanted))
    summary.plan = [_plan_row(config, label, prediction, (output_mean, sequence_mean), measured.get(prediction.n)) for (label, _), prediction in zip(wanted, predictions)]
    return summary


def _planned_samples(config: DataCurveConfig) -> int | None:
    if config.samples is None:
        return None
    from draftsmith.core.units import parse_count

    value = parse_count(config.samples, "--samples")
    if value < 1 or value > 1e12 or value != int(value):
        raise InputError(f"--samples must be a whole number between 1 and 10^12, got {config.samples!r}")
    return int(value)


def _curve_points(fit, replicas, sizes: list[int], largest: int) -> list[dict[str, float]]:
    ns = np.unique(np.geomspace(max(1, min(sizes) / 2), max(largest, max(sizes)) * 1.5, 60).astype(int))
    return [p.to_dict() for p in predict_with_interval(fit, replicas, ns.tolist())]


def _plan_row(config: DataCurveConfig, label: str, prediction, mean_tokens: tuple[float, float], measured: float | None) -> PlanRow:
    output_mean, sequence_mean = mean_tokens
    row = PlanRow(label=label, n=prediction.n, tau=prediction.tau, low=prediction.low, high=prediction.high,
                  measured=measured, extrapolated=prediction.extrapolated, supported=prediction.supported)
    rate = {"per_gpu": config.per_gpu, "gpus": config.gpus} if config.per_gpu else (
        {"throughput": config.throughput} if config.throughput else None)
    if rate:
        from draftsmith.plan.capacity import make_plan

        plan = make_plan({"samples": prediction.n, "output_mean": config.output_mean or output_mean, **rate})
        row.regeneration_days = plan.wall_time.days
        row.regeneration_gpus = config.gpus if config.per_gpu else None
    row.train_gpu_hours = _train_gpu_hours(config, prediction.n, sequence_mean)
    return row


def _train_gpu_hours(config: DataCurveConfig, samples: int, sequence_mean: float) -> float | None:
    from draftsmith.plan.training import make_train_plan

    try:
        plan = make_train_plan({"samples": samples, "mean_length": max(2.0, sequence_mean), "epochs": config.epochs,
                                "block_size": config.block_size, "draft_layers": config.num_draft_layers,
                                "num_anchors": config.num_anchors, "max_length": config.max_length,
                                "gpu": config.train_gpu, "gpus": config.train_gpus, "model_config_path": str(config.target)})
    except InputError as error:
        _log(f"[plan data] no training estimate: {error}")
        return None
    return plan.headline.wall_time.hours * config.train_gpus


def _smoke_verdict(config: DataCurveConfig, records, rows, baselines) -> SmokeVerdict | None:
    if not records:
        return None
    smallest = rows[0]
    if not smallest.tau:
        return None
    trained = float(np.mean(smallest.tau))
    bars = {name: value for name, value in baselines.items() if name in ("ngram", "untrained")}
    margin = config.smoke_margin
    beaten = {name: trained >= value + margin for name, value in bars.items()}
    rising = None
    done = [row for row in rows if row.tau]
    if len(done) >= 2:
        first, last = np.asarray(done[0].per_position), np.asarray(done[-1].per_position)
        rising = bool(last[0] > first[0]) if len(first) and len(last) else None
    passed = all(beaten.values()) and rising is not False and all(row.lossless for row in done)
    causes = [] if passed else _likely_causes(config, trained, bars, rising)
    return SmokeVerdict(passed=passed, trained_tau=trained, bars=bars, margin=margin, rising=rising, causes=causes)


def _likely_causes(config: DataCurveConfig, trained: float, bars: dict[str, float], rising: bool | None) -> list[str]:
    """What the known failures look like, checked on the data where it can be."""
    from draftsmith.data.tokenized import load_tokenized

    causes = []
    dataset = load_tokenized(config.data, max_length=config.max_length, split=config.split)
    trainable = dataset.trainable_counts
    if len(trainable):
        median = float(np.median(trainable))
        few = float(np.mean(trainable <= 8))
        if median < 32 or few > 0.25:
            causes.append(f"too few trainable tokens: median {median:.0f} per sample, {few:.0%} with 8 or fewer "
                          "(boilerplate-only answers: run `draftsmith audit` on the data)")
    if bars.get("untrained") is not None and trained < bars["untrained"] + config.smoke_margin:
        causes.append("no better than an untrained drafter: the recipe did not learn (check the loss in the run's "
                      "train_log.jsonl, --lr, --epochs; `draftsmith check --overfit` tells a wiring fault from too little data)")
    if bars.get("ngram") is not None and trained < bars["ngram"] + config.smoke_margin:
        causes.append("below prompt lookup: at this size the data, not the trainer, limits the drafter; the curve says how much more helps")
    if rising is False:
        causes.append("acceptance does not rise with data: the subsets may repeat one another (near-duplicate samples)")
    return causes


__all__ = ["METHODS", "plan_data", "resolve_sizes", "summarize"]
