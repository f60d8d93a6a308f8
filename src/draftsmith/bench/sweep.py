"""Concurrency sweep of ONE endpoint with real prompts, and knee detection (contract 3).

At each concurrency level ``c``, ``c`` closed-loop workers send prompts from the dataset (cycled,
in a seeded shuffled order) until the level's request count is done; after an unmeasured warm-up
of ``c`` requests. Output tokens come from ``usage.completion_tokens`` (else the returned token
ids). TTFT is measured when streaming.

The knee is the smallest concurrency whose output tok/s reaches ``1 - knee_tolerance`` of the
best level's: more concurrency beyond it buys latency, not throughput. ``plan`` reads
``knee.output_tokens_per_s`` as the per-GPU throughput.

Where the endpoint serves Prometheus ``/metrics`` (vLLM, SGLang), each level also stores
``engine_metrics`` (the running batch, waiting queue, KV cache usage and speculative acceptance the
engine reported while the level ran; ``bench.engine_metrics``), and ``warnings`` says where fewer
requests ran at once than were sent.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable


from draftsmith.bench.config import DEFAULT_CONCURRENCIES, BenchConfig
from draftsmith.bench.engine_metrics import MetricsPoller, cap_warning
from draftsmith.core.errors import DraftsmithError, InputError
from draftsmith.core.io import write_json_atomic
from draftsmith.core.limits import workers_for
from draftsmith.core.redact import redact_url
from draftsmith.client.chat import (
    ChatClient,
    ClientError,
    EndpointConnectionError,
    chat_payload,
    normalize_base_url,
)
from draftsmith.core.paths import require_dir
from draftsmith.data.prompts import load_prompts
from draftsmith.data.thinking import choose_thinking, read_chat_template
from draftsmith.core.asyncrun import run_async

#: the largest bench level: far above any engine's batch limit, far below what exhausts memory
MAX_BENCH_CONCURRENCY = 65_536


@dataclass
class LevelResult:
    concurrency: int
    output_tokens_per_s: float
    requests_per_s: float
    latency_p50_s: float
    latency_p99_s: float
    ttft_p50_s: float | None
    mean_output_tokens: float
    requests: int
    engine_metrics: dict[str, Any] | None = None
    """What the engine ran during the level, from its /metrics (running batch, cache usage, acceptance); None without."""


@dataclass
class BenchResult:
    engine: str
    model: str
    endpoint: str
    max_tokens: int
    results: list[LevelResult]
    knee: dict[str, Any]
    errors: int = 0
    """Failed requests over the sweep (not part of the JSON contract; printed, not saved)."""
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": "draftsmith.bench",
            "version": 1,
            "engine": self.engine,
            "model": self.model,
            "endpoint": self.endpoint,
            "max_tokens": self.max_tokens,
            "results": [asdict(level) for level in self.results],
            "knee": dict(self.knee),
            "warnings": list(self.warnings),
        }

    def save(self, path: str | Path) -> Path:
        """Write the contract-3 JSON atomically."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        return write_json_atomic(path, self.to_dict())

    def render(self, console) -> None:
        from rich.table import Table

        table = Table(title=f"draftsmith bench: {self.engine} / {self.model} @ {self.endpoint}")
        metrics = any(level.engine_metrics for level in self.results)
        columns = ["concurrency", "out tok/s", "req/s", "p50 latency", "p99 latency", "p50 TTFT", "mean out tok", "requests"]
        for column in columns + (["running max/mean", "cache use max"] if metrics else []):
            table.add_column(column, justify="right")
        for level in self.results:
            mark = " <- knee" if level.concurrency == self.knee["concurrency"] else ""
            table.add_row(
                f"{level.concurrency}{mark}", f"{level.output_tokens_per_s:,.0f}", f"{level.requests_per_s:,.2f}",
                f"{level.latency_p50_s:.3f}s", f"{level.latency_p99_s:.3f}s",
                "-" if level.ttft_p50_s is None else f"{level.ttft_p50_s:.3f}s",
                f"{level.mean_output_tokens:,.1f}", str(level.requests),
                *(_metric_cells(level.engine_metrics) if metrics else []),
            )
        console.print(table)


def _metric_cells(record: dict[str, Any] | None) -> list[str]:
    if not record:
        return ["-", "-"]
    usage = record.get("cache_usage_max")
    return [f"{record['running_max']:g}/{record['running_mean']:.1f}", "-" if usage is None else f"{usage:.0%}"]


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (q in [0, 100])."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100.0
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def find_knee(results: list[LevelResult], tolerance: float = 0.1) -> dict[str, Any]:
    """The smallest concurrency reaching ``(1 - tolerance)`` of the best output tok/s."""
    if not results:
        raise ValueError("no results")
    best = max(level.output_tokens_per_s for level in results)
    for level in sorted(results, key=lambda r: r.concurrency):
        if level.output_tokens_per_s >= (1.0 - tolerance) * best:
            return {"concurrency": level.concurrency, "output_tokens_per_s": level.output_tokens_per_s}
    raise AssertionError("unreachable")


async def _describe_endpoint(client: ChatClient, base: str) -> tuple[str, str]:
    try:
        status, body = await client.get_json(base + "/v1/models")
    except EndpointConnectionError as error:
        raise DraftsmithError(f"bench: cannot reach {redact_url(base)} ({error})") from None
    if status != 200 or not isinstance(body, dict) or not body.get("data"):
        raise DraftsmithError(f"bench: {redact_url(base)}/v1/models answered HTTP {status}; pass --model and --engine")
    entry = body["data"][0]
    return str(entry.get("id")), str(entry.get("owned_by") or "unknown")


async def arun_bench(config: BenchConfig, log: Callable[[str], None] = lambda message: None) -> BenchResult:
    """Run the sweep (async)."""
    if not config.concurrencies or any(c < 1 for c in config.concurrencies):
        raise InputError("bench: concurrency levels must be positive integers")
    too_many = [c for c in config.concurrencies if c > MAX_BENCH_CONCURRENCY]
    if too_many:  # each level sends 4x its concurrency requests: 1e9 would never finish
        raise InputError(f"--concurrency {too_many[0]}: above {MAX_BENCH_CONCURRENCY:,} requests in flight, which no "
                         "single engine serves; bench levels up to the engine's batch limit")
    samples, _ = load_prompts(config.prompts, config.split)
    if not samples:
        raise InputError(f"bench: no prompts in {config.prompts}")
    order = list(samples)
    random.Random(config.seed).shuffle(order)
    base = normalize_base_url(config.endpoint)
    levels = sorted(set(config.concurrencies))
    async with ChatClient(connections=max(levels) + 4, timeout_s=config.timeout_s, api_key=config.api_key) as client:
        model, owner = await _describe_endpoint(client, base)
        poller = MetricsPoller(client, base, config.metrics_interval_s)
        if config.metrics and await poller.probe():
            log(f"recording the engine's running batch and cache usage from {redact_url(base)}/metrics")
        model = config.model or model
        engine = config.engine or owner
        template = read_chat_template(require_dir(config.target, "--target")) if config.target else \
            await client.chat_template(base)
        thinking = choose_thinking(template, config.chat_template_kwargs)
        log(thinking.line)
        payload = chat_payload(model, config.max_tokens, stream=config.stream, temperature=config.temperature,
                               top_p=config.top_p, chat_template_kwargs=thinking.kwargs,
                               extra_body=config.extra_body)
        cursor = 0
        errors = 0
        results = []
        warnings: list[str] = []

        async def run_level(concurrency: int, count: int) -> tuple[list, float]:
            nonlocal cursor, errors
            outcomes: list = []
            remaining = count

            async def worker() -> None:
                nonlocal cursor, remaining, errors
                while remaining > 0:
                    remaining -= 1
                    sample = order[cursor % len(order)]
                    cursor += 1
                    try:
                        outcomes.append(await client.chat(base, {**payload, "messages": sample.messages, **({"tools": sample.tools} if sample.tools else {})}))
                    except ClientError as error:
                        errors += 1
                        log(f"request failed: {error}")

            start = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(workers_for(concurrency, count))))
            return outcomes, time.perf_counter() - start

        for concurrency in levels:
            count = config.requests_per_level or max(config.min_requests, 4 * concurrency)
            if config.warmup:
                await run_level(concurrency, concurrency)
            measured = asyncio.ensure_future(run_level(concurrency, count))
            engine_metrics = await poller.record(measured, concurrency)
            outcomes, wall = measured.result()
            if not outcomes:
                raise DraftsmithError(f"bench: every request at concurrency {concurrency} failed (see messages above)")
            tokens = [
                o.completion_tokens if o.completion_tokens is not None else len(o.completion_token_ids or [])
                for o in outcomes
            ]
            latencies = [o.latency_s for o in outcomes]
            ttfts = [o.ttft_s for o in outcomes if o.ttft_s is not None]
            level = LevelResult(
                concurrency=concurrency,
                output_tokens_per_s=round(sum(tokens) / wall, 3),
                requests_per_s=round(len(outcomes) / wall, 4),
                latency_p50_s=round(percentile(latencies, 50), 4),
                latency_p99_s=round(percentile(latencies, 99), 4),
                ttft_p50_s=round(percentile(ttfts, 50), 4) if ttfts else None,
                mean_output_tokens=round(statistics.fmean(tokens), 2),
                requests=len(outcomes),
                engine_metrics=engine_metrics,
            )
            warning = cap_warning(engine_metrics)
            if warning:
                log(f"warning: {warning}")
                warnings.append(warning)
            log(f"concurrency {concurrency}: {level.output_tokens_per_s:,.0f} out tok/s, "
                f"{level.requests_per_s:,.2f} req/s, p50 {level.latency_p50_s:.3f}s")
            results.append(level)
    return BenchResult(engine=engine, model=model, endpoint=redact_url(base), max_tokens=config.max_tokens, results=results,
                       knee=find_knee(results, config.knee_tolerance), errors=errors, warnings=warnings)


def run_bench(config: BenchConfig, log: Callable[[str], None] = lambda message: None) -> BenchResult:
    """Blocking variant of ``arun_bench`` (notebook-safe like ``generate``)."""
    return run_async(arun_bench(config, log))


def load_bench(path: str | Path) -> dict[str, Any]:
    """Read and check a contract-3 bench JSON."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise InputError(f"{path}: cannot read bench JSON ({error})") from None
    if data.get("kind") != "draftsmith.bench" or data.get("version") != 1:
        raise InputError(f"{path}: not a draftsmith bench result (kind/version)")
    return data
