"""The status of `generate` output directories: one row per shard, aggregated exactly.

Per shard it takes the progress record the writer keeps (`draftsmith.data.run_records`) and parses
only what was appended to each row part after the record's byte offset, so a 914k-row directory is
read in a fraction of a second; a part the record does not cover (a directory written before the
record existed) is parsed whole. Rows are counted per shard file: generate writes each sample of a
shard only into that shard's parts, once, so the sum over shards counts every sample once.
"""

from __future__ import annotations

import calendar
import re
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

from draftsmith.core.errors import InputError
from draftsmith.core.manifest import read_manifest
from draftsmith.core.redact import redact_url
from draftsmith.data.run_records import RowStats, failure_kind, histogram_quantile, progress_name, read_progress
from draftsmith.status.config import ShardStatus, StatusConfig, StatusSummary, worst_state
from draftsmith.status.reading import describe_writer, json_lines, list_directory, read_json

# A shard shows itself by any of its files; by its lock alone while a run is still loading its prompts.
_SHARD_FILE = re.compile(r"^(?:generated-(s\d+of\d+)-\d+\.jsonl|failures-(s\d+of\d+)\.jsonl|summary-(s\d+of\d+)\.json|"
                         r"progress-(s\d+of\d+)\.json|\.draftsmith\.(s\d+of\d+)\.lock)$")  # fmt: skip
_TAG = re.compile(r"s(\d+)of(\d+)")
MIN_FAILURES_TO_FAIL = 5


def shard_tags(names: list[str]) -> list[str]:
    tags = {next(group for group in match.groups() if group) for name in names if (match := _SHARD_FILE.match(name))}
    return sorted(tags, key=lambda tag: tuple(map(int, _TAG.match(tag).groups())))


def _part_stats(directory: Path, tag: str, record: dict | None) -> tuple[RowStats, RowStats, int, float | None]:
    """(all rows, rows of this run's record basis, bytes, newest part mtime)."""
    known = (record or {}).get("parts") or {}
    started = (record or {}).get("started_at") or float("inf")
    every, basis, size, newest = RowStats(), RowStats(), 0, None
    for part in sorted(directory.glob(f"generated-{tag}-*.jsonl")):
        stat = part.stat()
        size += stat.st_size
        newest = max(newest or 0.0, stat.st_mtime)
        entry = known.get(part.name)
        covered = entry is not None and stat.st_size >= int(entry.get("bytes", 0))
        stats = RowStats(entry) if covered else RowStats()
        for row in json_lines(part, int(entry["bytes"]) if covered else 0):
            stats.add(row)
        every.merge(stats)
        if covered or stat.st_mtime >= started:
            basis.merge(stats)
    return every, basis, size, newest


def _failures(directory: Path, tag: str, record: dict | None, since: float) -> tuple[Counter, set, int]:
    """This run's failures (from the record's start offset; every line without a record): kinds, ids,
    and how many fell in the window."""
    path = directory / f"failures-{tag}.jsonl"
    kinds, ids, recent = Counter(), set(), 0
    try:
        entries = list(json_lines(path, int((record or {}).get("failures_start") or 0)))
    except FileNotFoundError:
        return kinds, ids, recent
    for entry in entries:
        ids.add(str(entry.get("id")))
        kinds[failure_kind(str(entry.get("reason", "")))] += 1
        try:
            recent += calendar.timegm(time.strptime(str(entry.get("time")), "%Y-%m-%dT%H:%M:%SZ")) >= since
        except ValueError:
            continue
    return kinds, ids, recent


def _rates(record: dict | None, basis: RowStats, now: float, window_s: float) -> dict[str, float | None]:
    """Rows/s and output tok/s over the window and since the run started, from the record's history."""
    if record is None or not record.get("started_at"):
        return {"rows_per_s": None, "output_tokens_per_s": None, "rows_since": None, "tokens_since": None}
    started = float(record["started_at"])
    start = (started, int(record.get("rows_at_start", 0)), int(record.get("output_tokens_at_start", 0)))
    points = [start, *(tuple(p) for p in record.get("history") or [] if p[0] >= started)]
    current = (now, basis.rows, basis.output_tokens)
    cutoff = now - window_s
    base = max((p for p in points if p[0] <= cutoff), key=lambda p: p[0], default=points[0])

    def rate(a, b, column):
        return round((b[column] - a[column]) / (b[0] - a[0]), 4) if b[0] - a[0] > 0 else None

    return {"rows_per_s": rate(base, current, 1), "output_tokens_per_s": rate(base, current, 2),
            "rows_since": rate(start, current, 1), "tokens_since": rate(start, current, 2)}  # fmt: skip


def _count(summary: dict, field: str) -> int:
    value = summary.get(field)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0


def shard_status(directory: Path, tag: str, config: StatusConfig, window_s: float, stall_s: float, now: float) -> dict:
    record = read_progress(directory / progress_name(tag))
    summary_path = directory / f"summary-{tag}.json"
    summary = read_json(summary_path)
    if summary is not None and record is not None and summary_path.stat().st_mtime < float(record.get("started_at") or 0):
        summary = None  # an earlier run's: what it says (its stop reason) is not about the current run
    every, basis, size, newest = _part_stats(directory, tag, record)
    alive, writer = describe_writer(directory / f".draftsmith.{tag}.lock")
    kinds, failed_ids, recent_failures = _failures(directory, tag, record, now - window_s)
    if record is not None and record.get("input") is not None:
        total, failed = int(record["input"]), len(failed_ids) + int(record.get("skipped_failed") or 0)
    elif summary is not None:
        total = _count(summary, "input") - _count(summary, "duplicates")
        failed = _count(summary, "failed") + _count(summary, "skipped_failed")
    else:
        total, failed = None, len(failed_ids)
    last_row = max(filter(None, [newest, (record or {}).get("last_row_at")]), default=None)
    activity = max(filter(None, [last_row, (record or {}).get("started_at")]), default=None)
    age = None if activity is None else max(0.0, now - activity)
    rates = _rates(record, basis, now if alive is not False else (last_row or now), window_s)
    remaining = None if total is None else max(0, total - every.rows - failed)
    # Without a record there is no window rate: the failures are then weighed against every row.
    window_rows = every.rows if rates["rows_per_s"] is None else rates["rows_per_s"] * window_s
    failing = recent_failures >= MIN_FAILURES_TO_FAIL and recent_failures >= config.failing_share * (recent_failures + window_rows)
    note = None
    if alive is False:
        if remaining == 0:
            state = "finished"
        elif summary is not None and summary.get("guard_tripped"):
            state, note = "failing", f"quality guard: {summary.get('stopped_reason')}"
        else:
            state = "dead"
            left = f"{remaining if remaining is not None else '?'} samples remain: rerun to resume"
            note = (summary or {}).get("stopped_reason") or ("killed: the writer died mid-run" if "dead" in writer else left)
    elif age is not None and age > stall_s:
        state, note = "stalled", f"no row written for {age:.0f}s"
    else:
        state = "failing" if failing else "running"
        note = f"{recent_failures} failures in the window" if failing else None
    shard = ShardStatus(name=tag, directory=str(directory), state=state, done=every.rows, total=total, failed=failed,
                        rows_per_s=rates["rows_per_s"], output_tokens_per_s=rates["output_tokens_per_s"], writer=writer,
                        writer_alive=alive, last_write_age_s=None if last_row is None else round(max(0.0, now - last_row), 1),
                        note=note)  # fmt: skip
    return {"shard": shard, "stats": every, "kinds": kinds, "bytes": size, "rates": rates, "record": record,
            "summary": summary, "remaining": remaining}  # fmt: skip


def _settings(directory: Path, views: list[dict]) -> dict[str, Any]:
    manifest = read_manifest(directory) or {}
    settings = dict(manifest.get("settings") or {})
    endpoints: list[str] = []
    for view in views:
        recorded = ((view["record"] or {}).get("settings") or {}).get("endpoints")
        recorded = recorded or [e.get("url") for e in (view["summary"] or {}).get("endpoints") or [] if isinstance(e, dict)]
        endpoints += [redact_url(str(url)) for url in recorded or [] if url and redact_url(str(url)) not in endpoints]
    if endpoints:
        settings["endpoints"] = endpoints
    return settings


def _lengths(stats: RowStats, max_tokens: int | None) -> dict[str, Any]:
    rows = stats.rows
    cap = max_tokens if isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens > 0 else None
    return {
        "rows": rows, "mean": round(stats.output_tokens / rows, 1) if rows else None,
        "p50": histogram_quantile(stats.histogram, 0.5, cap), "p90": histogram_quantile(stats.histogram, 0.9, cap),
        "max_tokens": max_tokens, "length_share": round(stats.length_finish / rows, 4) if rows else None,
        "thinking_share": round(stats.reasoning_tokens / stats.output_tokens, 4) if stats.output_tokens else None,
    }  # fmt: skip


def _sum(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return round(sum(present), 4) if present else None


def collect_shards(directories: list[Path], config: StatusConfig, window_s: float, stall_s: float, now: float) -> list[dict]:
    views: list[dict] = []
    seen: dict[str, Path] = {}
    for directory in directories:
        for tag in shard_tags(list_directory(directory)):
            if tag in seen:
                raise InputError(f"{directory}: shard {tag} is also in {seen[tag]}: each shard's rows would count twice; "
                                 f"give each node's directory once")  # fmt: skip
            seen[tag] = directory
            views.append(shard_status(directory, tag, config, window_s, stall_s, now))
    return views


def generate_status(directories: list[Path], config: StatusConfig, window_s: float, stall_s: float) -> StatusSummary:
    now = time.time()
    views = collect_shards(directories, config, window_s, stall_s, now)
    if not views:
        raise InputError(f"{directories[0]}: a generate directory without rows, failures or a progress record yet: "
                         f"nothing to report")  # fmt: skip
    shards = [view["shard"] for view in views]
    stats = RowStats()
    kinds: Counter[str] = Counter()
    for view in views:
        stats.merge(view["stats"])
        kinds.update(view["kinds"])
    settings = _settings(directories[0], views)
    expected = int(settings.get("shard_count") or _TAG.match(shards[0].name).group(2))
    missing = [f"s{i}of{expected}" for i in range(expected) if f"s{i}of{expected}" not in {s.name for s in shards}]
    known_totals = [s.total for s in shards if s.total is not None]
    total: int | None = sum(known_totals) if known_totals else None
    estimated = bool(missing) or len(known_totals) < len(shards)
    if total is not None and estimated:  # shards not started yet hold about as many samples as the others
        total = round(total * expected / len(known_totals))
    done, failed = sum(s.done or 0 for s in shards), sum(s.failed for s in shards)
    # The job's rate is what its live shards do now: a dead or finished shard's last rate is history.
    live = [view for view in views if view["shard"].state in ("running", "stalled", "failing")]
    live = live or [view for view in views if view["shard"].state == "finished"]  # a finished job: its last rates
    rows_rate = _sum([view["shard"].rows_per_s for view in live])
    state = worst_state([s.state for s in shards] + (["dead"] if missing and all(s.state == "finished" for s in shards) else []))
    remaining = None if total is None else max(0, total - done - failed)
    eta = None if remaining is None else (0.0 if remaining == 0 else (remaining / rows_rate if rows_rate else None))
    summary = StatusSummary(
        stage="generate", state=state, directories=[str(d) for d in directories], done=done, total=total,
        total_estimated=estimated, rows_per_s=rows_rate, rows_per_s_since_start=_sum([v["rates"]["rows_since"] for v in live]),
        output_tokens_per_s=_sum([v["shard"].output_tokens_per_s for v in live]),
        output_tokens_per_s_since_start=_sum([v["rates"]["tokens_since"] for v in live]),
        eta_s=None if eta is None else round(eta, 1), finishes_at=None if eta is None else round(now + eta),
        writer_alive=_aggregate_alive([s.writer_alive for s in shards if s.state != "finished"]),
        last_write_age_s=min((s.last_write_age_s for s in shards if s.last_write_age_s is not None), default=None),
        failures=dict(kinds), failed=failed, settings=settings,
        lengths=_lengths(stats, settings.get("max_tokens")), shards=shards,
    )  # fmt: skip
    summary.replan = _replan(summary, config.planned_tokens)
    summary.disk = _disk(directories[0], sum(v["bytes"] for v in views), stats.rows, remaining)
    summary.alerts = _alerts(summary, missing)
    return summary


def _aggregate_alive(values: list[bool | None]) -> bool | None:
    if not values:
        return False
    if any(value is False for value in values):
        return False
    return True if all(value is True for value in values) else None


def _replan(summary: StatusSummary, planned: float | None) -> dict[str, Any] | None:
    measured = summary.lengths.get("mean")
    if not planned or not measured:
        return None
    change = measured / planned - 1
    replan: dict[str, Any] = {"planned_tokens": planned, "measured_tokens": measured, "change": round(change, 4)}
    if summary.eta_s is not None and summary.finishes_at is not None:
        # At the measured token rate the planned mean would have needed planned/measured of the time left.
        replan["planned_finishes_at"] = round(summary.finishes_at - summary.eta_s * (1 - planned / measured))
        replan["finishes_at"] = summary.finishes_at
    return replan


def _disk(directory: Path, size: int, rows: int, remaining: int | None) -> dict[str, Any] | None:
    try:
        free = shutil.disk_usage(directory).free
    except OSError:
        return None
    need = round(remaining * size / rows) if rows and remaining is not None else None
    return {"free_bytes": free, "written_bytes": size, "needed_bytes": need, "enough": None if need is None else need <= free}


def _alerts(summary: StatusSummary, missing: list[str]) -> list[str]:
    alerts = [f"shard {s.name}: {s.state}" + (f" ({s.note})" if s.note else "") for s in summary.shards
              if s.state in ("stalled", "dead", "failing")]  # fmt: skip
    if missing:
        alerts.append(f"shards not started (no files yet): {', '.join(missing)}; the total is estimated from the others")
    if summary.disk and summary.disk["enough"] is False:
        alerts.append("not enough free disk for the rest of the job")
    share = summary.lengths.get("length_share")
    if share is not None and share > 0.1:
        alerts.append(f"{share:.0%} of outputs stopped at max tokens: raise --max-tokens or expect cut answers")
    return alerts
