"""The status of a train, tokenize, extract or export output directory (one directory each).

train: `train_log.jsonl` (step records, eval records; ``time`` and ``total_steps`` in runs that
record them), the newest `checkpoints/step-N`, `drafter-best/record.json`, `train_summary.json` and
the lock. tokenize: its manifest, `tokenize_summary.json` and the lock. extract: `index.json` (the
shards written so far, of ``num_samples``). export: the directory appears whole when it is done.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from draftsmith.core.lock import LOCK_NAME, lock_beside
from draftsmith.core.manifest import read_manifest
from draftsmith.status.config import ShardStatus, StatusSummary
from draftsmith.status.reading import describe_writer, json_lines, list_directory, newest_mtime, read_json

TRAIN_LOG = "train_log.jsonl"
TRAIN_SUMMARY = "train_summary.json"
CHECKPOINTS = "checkpoints"
BEST_RECORD = Path("drafter-best") / "record.json"


def _state(alive: bool | None, finished: bool, age: float | None, stall_s: float) -> str:
    if alive is False:
        return "finished" if finished else "dead"
    if age is not None and age > stall_s:
        return "stalled"
    return "running"


def train_rates(steps: list[dict], now: float, window_s: float) -> tuple[float | None, float | None]:
    """(steps/s over the window, steps/s since the first timed record) from records carrying ``time``."""
    timed = [r for r in steps if isinstance(r.get("time"), (int, float))]
    if len(timed) < 2:
        return None, None
    last = timed[-1]
    recent = [r for r in timed if r["time"] >= now - window_s] or timed[-2:]
    base = recent[0] if recent[0] is not last else timed[-2]

    def rate(a, b):
        return (b["step"] - a["step"]) / (b["time"] - a["time"]) if b["time"] > a["time"] else None

    return rate(base, last), rate(timed[0], last)


def _checkpoint(directory: Path, now: float) -> dict[str, Any] | None:
    root = directory / CHECKPOINTS
    steps = sorted(root.glob("step-*")) if root.is_dir() else []
    if not steps:
        return None
    newest = steps[-1]
    return {"name": newest.name, "step": int(newest.name.split("-")[1]), "age_s": round(now - newest.stat().st_mtime, 1)}


def train_status(directory: Path, window_s: float, stall_s: float) -> StatusSummary:
    now = time.time()
    log_path = directory / TRAIN_LOG
    records = log_records(log_path)
    steps = step_records(records)
    evals = [r for r in records if "eval_tau" in r]
    last = steps[-1] if steps else {}
    config = read_json(directory / "train_config.json") or {}
    total = next((value for value in (last.get("total_steps"), config.get("max_steps"))
                  if isinstance(value, int) and not isinstance(value, bool) and value > 0), None)  # fmt: skip
    step = int(last.get("step", 0))
    rate, rate_since = train_rates(steps, now, window_s)
    alive, writer = describe_writer(directory / LOCK_NAME)
    last_write = newest_mtime([log_path, directory / LOCK_NAME])
    age = None if last_write is None else round(now - last_write, 1)
    run_summary = read_json(directory / TRAIN_SUMMARY)
    stopped = _stopped_early(run_summary, step)
    finished = run_summary is not None and (total is None or step >= total or not steps or stopped is not None)
    state = _state(alive, finished, age, stall_s)
    if state != "finished":
        stopped = None  # an earlier run's stop; this one is still running, or died after it
    remaining = 0 if state == "finished" else (None if total is None else max(0, total - step))
    eta = 0.0 if remaining == 0 else (remaining / rate if remaining is not None and rate else None)
    best = read_json(directory / BEST_RECORD)
    train = {
        "step": step, "total_steps": total, "loss": last.get("loss"), "tokens_per_s": last.get("tokens_per_s"),
        "train_tau": last.get("train_tau"), "steps_per_s": rate, "steps_per_s_since_start": rate_since,
        "last_eval": {k: evals[-1].get(k) for k in ("step", "eval_tau")} if evals else None,
        "drafter_best": {k: best.get(k) for k in ("step", "eval_tau")} if best else None,
        "checkpoint": _checkpoint(directory, now), "summary": run_summary is not None, "stopped": stopped,
    }  # fmt: skip
    shard = ShardStatus(name="train", directory=str(directory), state=state, done=step, total=total, writer=writer,
                        writer_alive=alive, last_write_age_s=age, note=stopped)  # fmt: skip
    summary = StatusSummary(
        stage="train", state=state, directories=[str(directory)], done=step, total=total, rows_per_s=rate,
        rows_per_s_since_start=rate_since, output_tokens_per_s=last.get("tokens_per_s"),
        eta_s=None if eta is None else round(eta, 1), finishes_at=None if eta is None else round(now + eta),
        writer_alive=alive, last_write_age_s=age, settings=_train_settings(config), train=train, shards=[shard],
    )  # fmt: skip
    if state in ("stalled", "dead"):
        summary.alerts.append(f"train: {state} (writer {writer}, last log write {age}s ago)")
    return summary


def step_records(records: list[dict]) -> list[dict]:
    """The optimizer-step records of a `train_log.jsonl` (not its eval records)."""
    return [r for r in records if "loss" in r and isinstance(r.get("step"), int)]


def log_records(path: Path) -> list[dict]:
    try:
        return list(json_lines(path))
    except FileNotFoundError:
        return []


def _stopped_early(run_summary: dict | None, step: int) -> str | None:
    """Why a run that ended before its planned steps stopped as it was asked to (`train --max-minutes`),
    when its summary says so and no later run has logged past it; else None."""
    extra = (run_summary or {}).get("extra")
    if not isinstance(extra, dict) or extra.get("stopped_by_max_minutes") is not True:
        return None
    steps = run_summary.get("steps")
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < step:
        return None
    return f"stopped by --max-minutes at step {steps}; `train --resume` continues it"


def _train_settings(config: dict) -> dict[str, Any]:
    keys = ("target", "data", "offline_features", "epochs", "max_steps", "batch_size", "grad_accum", "lr", "block_size",
            "max_length", "sharding")
    return {key: config[key] for key in keys if key in config}


def other_status(stage: str, directory: Path, stall_s: float) -> StatusSummary:
    """tokenize, extract and export: running, finished or dead, with done/total where the stage records it."""
    now = time.time()
    lock = lock_beside(directory) if stage == "export" else directory / LOCK_NAME
    alive, writer = describe_writer(lock)
    names = list_directory(directory)
    manifest = read_manifest(directory) or {}
    done = total = None
    if stage == "extract":
        index = read_json(directory / "index.json") or {}
        done = sum(int(shard.get("count", 0)) for shard in index.get("shards") or [])
        total = index.get("num_samples")
        finished = bool(index.get("complete"))
    elif stage == "tokenize":
        summary = read_json(directory / "tokenize_summary.json")
        finished = summary is not None and manifest.get("complete") is not False
        if summary is not None:
            done = int(summary.get("written", 0)) + int(summary.get("previously_written", 0))
    else:  # export publishes the directory whole (a rename): present means written
        finished = True
    last_write = newest_mtime([directory / name for name in names] + [lock])
    age = None if last_write is None else round(now - last_write, 1)
    state = _state(alive, finished, age, stall_s)
    shard = ShardStatus(name=stage, directory=str(directory), state=state, done=done, total=total, writer=writer,
                        writer_alive=alive, last_write_age_s=age)  # fmt: skip
    result = StatusSummary(stage=stage, state=state, directories=[str(directory)], done=done, total=total,
                           writer_alive=alive, last_write_age_s=age, settings=dict(manifest.get("settings") or {}),
                           shards=[shard])  # fmt: skip
    if state in ("stalled", "dead"):
        result.alerts.append(f"{stage}: {state} (writer {writer})")
    return result
