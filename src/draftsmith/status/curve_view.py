"""The status of a `plan data` output directory: the curve's runs, done and left, and the ETA.

`plan data` writes `curve_runs.json` (every subset x seed run it will train, with its steps) before
the first run starts. A run is done when its `curve_eval.json` (the held-out measurement) exists;
the run in progress is an ordinary train directory whose `train_log.jsonl` says its step. Progress
counts training steps across the whole curve (the steps grow with the subset, so runs are not
equal); the rate is the running (or last) run's, and the ETA covers training, not the evaluations.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from draftsmith.core.lock import LOCK_NAME
from draftsmith.status.config import ShardStatus, StatusSummary
from draftsmith.status.reading import describe_writer, newest_mtime, read_json
from draftsmith.status.stage_views import TRAIN_LOG, log_records, step_records, train_rates

RUNS_FILE = "curve_runs.json"
EVAL_FILE = "curve_eval.json"
CURVE_FILE = "curve.json"


def _run_view(directory: Path, run: dict[str, Any]) -> dict[str, Any]:
    run_dir = directory / str(run.get("dir", ""))
    planned = int(run.get("steps") or 0)
    measured = read_json(run_dir / EVAL_FILE)
    steps = step_records(log_records(run_dir / TRAIN_LOG))
    if measured is not None:
        done, phase = planned, "measured"
    elif steps:
        done, phase = min(planned, int(steps[-1]["step"])), "training"
    else:
        done, phase = 0, "pending"
    tau = measured.get("tau") if measured else None
    return {"name": f"n={int(run.get('size', 0)):,} seed {run.get('seed')}", "dir": run_dir, "planned": planned, "done": done,
            "phase": phase, "tau": tau, "steps": steps}  # fmt: skip


def curve_status(directory: Path, window_s: float, stall_s: float) -> StatusSummary:
    now = time.time()
    plan = read_json(directory / RUNS_FILE) or {}
    runs = [_run_view(directory, run) for run in plan.get("runs") or [] if isinstance(run, dict)]
    curve = read_json(directory / CURVE_FILE)
    alive, writer = describe_writer(directory / LOCK_NAME)
    last_write = newest_mtime([directory / LOCK_NAME, directory / RUNS_FILE, *(run["dir"] / TRAIN_LOG for run in runs),
                               *(run["dir"] / EVAL_FILE for run in runs)])  # fmt: skip
    age = None if last_write is None else round(now - last_write, 1)
    measured = sum(run["phase"] == "measured" for run in runs)
    stopped_early = bool(curve and curve.get("stopped_early"))
    if alive:
        state = "stalled" if age is not None and age > stall_s else "running"
    else:
        state = "finished" if curve is not None and (measured == len(runs) or stopped_early) else "dead"
    done, total = sum(run["done"] for run in runs), sum(run["planned"] for run in runs)
    active = next((run for run in runs if run["phase"] == "training"), None) or next(
        (run for run in reversed(runs) if run["steps"]), None)
    rate, rate_since = train_rates(active["steps"], now, window_s) if active else (None, None)
    remaining = 0 if state == "finished" else total - done
    eta = 0.0 if remaining == 0 else (remaining / rate if rate else None)
    shards = [ShardStatus(name=run["name"], directory=str(run["dir"]), state=_run_state(run, state), done=run["done"],
                          total=run["planned"], note=_run_note(run)) for run in runs]  # fmt: skip
    note = None
    if state == "finished" and stopped_early:
        note = f"stopped by --max-minutes after {measured} of {len(runs)} runs; rerun `plan data` to continue"
    summary = StatusSummary(
        stage="plan data", state=state, directories=[str(directory)], done=done, total=total or None, rows_per_s=rate,
        rows_per_s_since_start=rate_since, eta_s=None if eta is None else round(eta, 1),
        finishes_at=None if eta is None else round(now + eta), writer_alive=alive, last_write_age_s=age,
        settings={"runs": len(runs), "measured": measured, "epochs": plan.get("epochs")},
        curve={"runs_total": len(runs), "runs_measured": measured, "method": (curve or {}).get("method"),
               "note": note}, shards=shards,
    )  # fmt: skip
    if not runs:
        summary.alerts.append(f"{directory / RUNS_FILE}: missing or empty; a `plan data` that has not started its first run")
    if state in ("stalled", "dead"):
        summary.alerts.append(f"plan data: {state} (writer {writer}, last write {age}s ago); rerun it: finished runs are reused")
    return summary


def _run_state(run: dict[str, Any], state: str) -> str:
    if run["phase"] == "measured":
        return "finished"
    if run["phase"] == "training" and state in ("running", "stalled", "dead"):
        return state
    return "pending"


def _run_note(run: dict[str, Any]) -> str:
    if run["phase"] == "measured":
        return f"held-out tau {run['tau']:.2f}" if isinstance(run["tau"], (int, float)) else "measured"
    return "training" if run["phase"] == "training" else "not started"
