"""What the engine really ran during a bench level, from its Prometheus `/metrics`.

A requested concurrency is not what runs: memory or a default cap (SGLang resets
`--max-running-requests` to 48 when speculating; vLLM's `--max-num-seqs`) may hold the running
batch below it, and then the sweep measures a smaller batch than it thinks. While a level runs,
`/metrics` is polled and each level stores:

- the running batch: vLLM `vllm:num_requests_running`, SGLang `sglang:num_running_reqs` (max and
  mean over the polls; summed over series, i.e. over data-parallel ranks);
- the waiting queue: `vllm:num_requests_waiting`, `sglang:num_queue_reqs`;
- KV cache usage (a fraction): `vllm:kv_cache_usage_perc` (older vLLM: `vllm:gpu_cache_usage_perc`),
  `sglang:token_usage`;
- speculative acceptance, tokens per verify step with the bonus token: vLLM 1 + delta
  `vllm:spec_decode_num_accepted_tokens_total` / delta `vllm:spec_decode_num_drafts_total` over the
  level; SGLang's gauge `sglang:spec_accept_length` (mean of the polls);
- vLLM's acceptance per draft position over the level (`spec_acceptance_per_position`: the share of
  verify steps that accepted position k, from delta `vllm:spec_decode_num_accepted_tokens_per_pos`
  by its `position` label over delta drafts, with the counts behind it), which `plan speculation
  --acceptance-from bench.json` reads.

Names from vllm/v1/metrics/loggers.py and SGLang's metrics docs (docs/references/production_metrics.md).
"""

from __future__ import annotations

import asyncio
import math
import re
import statistics
from typing import Any

from draftsmith.client.prometheus import VLLM_ACCEPTED_PER_POSITION, parse_samples, vllm_position_counts

RUNNING = ("vllm:num_requests_running", "sglang:num_running_reqs")
WAITING = ("vllm:num_requests_waiting", "sglang:num_queue_reqs")
CACHE_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc", "sglang:token_usage")
VLLM_ACCEPTED, VLLM_DRAFTS = "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_drafts_total"
SGLANG_ACCEPT_LENGTH = "sglang:spec_accept_length"
# Held in a snapshot as the per-position counts in position order (summed over engines), not one value
# per label set as the other metrics are.
POSITIONS = VLLM_ACCEPTED_PER_POSITION + "_total"
_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+(?P<value>\S+)")


def parse_prometheus(text: str) -> dict[str, list[float]]:
    """Sample values by metric name (one per label set), comments and unparsable lines skipped."""
    values: dict[str, list[float]] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line.strip())
        if not match:
            continue
        try:
            value = float(match.group("value"))
        except ValueError:
            continue
        if math.isfinite(value):
            values.setdefault(match.group("name"), []).append(value)
    return values


def read_snapshot(text: str) -> dict[str, list[float]]:
    """One poll: `parse_prometheus`, with vLLM's per-position acceptance counts in position order."""
    parsed = parse_prometheus(text)
    counts = vllm_position_counts(parse_samples(text)) if VLLM_ACCEPTED_PER_POSITION in text else None
    if counts is not None:
        parsed[POSITIONS] = counts.accepted_per_position
    return parsed


def _first(snapshot: dict[str, list[float]], names: tuple[str, ...]) -> list[float] | None:
    return next((snapshot[name] for name in names if name in snapshot), None)


def engine_family(snapshot: dict[str, list[float]]) -> str | None:
    """"vllm" or "sglang" by the running-batch metric it serves, else None."""
    for name in RUNNING:
        if name in snapshot:
            return name.split(":")[0]
    return None


def summarize(snapshots: list[dict[str, list[float]]], concurrency: int) -> dict[str, Any] | None:
    """One level's record from the polls taken while it ran (the first and last bracket it)."""
    running = [sum(values) for snapshot in snapshots if (values := _first(snapshot, RUNNING)) is not None]
    if not running:
        return None
    waiting = [sum(values) for snapshot in snapshots if (values := _first(snapshot, WAITING)) is not None]
    usage = [max(values) for snapshot in snapshots if (values := _first(snapshot, CACHE_USAGE)) is not None]
    record: dict[str, Any] = {
        "engine": engine_family(snapshots[0]) or engine_family(snapshots[-1]),
        "polls": len(running),
        "requested_concurrency": concurrency,
        "running_max": max(running),
        "running_mean": round(statistics.fmean(running), 3),
        "waiting_max": max(waiting) if waiting else None,
        "cache_usage_max": round(max(usage), 4) if usage else None,
        "cache_usage_mean": round(statistics.fmean(usage), 4) if usage else None,
        "spec_acceptance": _acceptance(snapshots),
    }
    record.update(_acceptance_per_position(snapshots))
    return record


def _acceptance_per_position(snapshots: list[dict[str, list[float]]]) -> dict[str, Any]:
    """The level's vLLM per-position acceptance and its counts (nothing without the counters)."""
    first, last = snapshots[0], snapshots[-1]
    if not (VLLM_DRAFTS in first and VLLM_DRAFTS in last and POSITIONS in last):
        return {}
    drafts = sum(last[VLLM_DRAFTS]) - sum(first[VLLM_DRAFTS])
    before, after = first.get(POSITIONS, []), last[POSITIONS]
    accepted = [count - (before[k] if k < len(before) else 0.0) for k, count in enumerate(after)]
    if drafts <= 0:
        return {}
    return {"spec_drafts": int(round(drafts)), "spec_accepted_per_position": [int(round(c)) for c in accepted],
            "spec_acceptance_per_position": [round(count / drafts, 6) for count in accepted]}


def _acceptance(snapshots: list[dict[str, list[float]]]) -> float | None:
    first, last = snapshots[0], snapshots[-1]
    if VLLM_DRAFTS in first and VLLM_DRAFTS in last:
        drafts = sum(last[VLLM_DRAFTS]) - sum(first[VLLM_DRAFTS])
        accepted = sum(last.get(VLLM_ACCEPTED, [0.0])) - sum(first.get(VLLM_ACCEPTED, [0.0]))
        return round(1 + accepted / drafts, 4) if drafts > 0 else None
    lengths = [statistics.fmean(s[SGLANG_ACCEPT_LENGTH]) for s in snapshots if s.get(SGLANG_ACCEPT_LENGTH)]
    lengths = [value for value in lengths if value > 0]
    return round(statistics.fmean(lengths), 4) if lengths else None


def cap_warning(record: dict[str, Any] | None) -> str | None:
    """The sweep's warning when fewer requests ran at once than it kept in flight."""
    if record is None or record["running_max"] >= record["requested_concurrency"]:
        return None
    return (f"concurrency {record['requested_concurrency']}: the engine ran at most {record['running_max']:g} requests at "
            f"once (mean {record['running_mean']:g}, waiting up to {'?' if record['waiting_max'] is None else format(record['waiting_max'], 'g')}"
            f"); a running-request cap (SGLang --max-running-requests, vLLM --max-num-seqs) or memory holds the batch "
            f"below what was sent")


class MetricsPoller:
    """Polls `{base}/metrics` through a `ChatClient` while a level runs."""

    def __init__(self, client: Any, base: str, interval_s: float = 0.25):
        self.client, self.url, self.interval_s = client, base.rstrip("/") + "/metrics", interval_s
        self.available: bool | None = None

    async def snapshot(self) -> dict[str, list[float]] | None:
        try:
            status, text = await self.client.get_text(self.url)
        except Exception:  # an endpoint without /metrics (or a flaky poll) records nothing, never fails the sweep
            return None
        if status != 200:
            return None
        parsed = read_snapshot(text)
        return parsed if engine_family(parsed) else None

    async def probe(self) -> bool:
        self.available = await self.snapshot() is not None
        return self.available

    async def record(self, level: asyncio.Future, concurrency: int) -> dict[str, Any] | None:
        """Poll until `level` is done; the level's record (None without metrics)."""
        if not self.available:
            await level
            return None
        snapshots = []
        while not level.done():
            snapshot = await self.snapshot()
            if snapshot is not None:
                snapshots.append(snapshot)
            await asyncio.wait([level], timeout=self.interval_s)
        final = await self.snapshot()
        if final is not None:
            snapshots.append(final)
        return summarize(snapshots, concurrency) if snapshots else None
