"""The generation run: prompts in, contract-1 rows out, resumable, across many endpoints.

Python API (also usable from a notebook, where an event loop is already running)::

    from draftsmith.generate import GenerateConfig, generate
    summary = generate(GenerateConfig(inputs=["prompts.jsonl"], output_dir="out",
                                      endpoints=["http://127.0.0.1:8000"]))
    assert summary.ok, summary.problems()

``agenerate(config)`` is the async variant. Rows are never lost or duplicated: see ``store.py``.
"""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections import deque
from pathlib import Path
from typing import Any, Callable

from draftsmith.core.errors import DraftsmithError, InputError
from draftsmith.core.manifest import check_manifest
from draftsmith.core.paths import require_output_dir
from draftsmith.core.redact import redact
from draftsmith.core.lock import lock_directory
from draftsmith.core.progress import Progress
from draftsmith.client.chat import (
    ChatClient,
    ChatResult,
    EndpointConnectionError,
    HTTPStatusError,
    IncompleteResponse,
    RequestTimeout,
    ResponseFormatError,
    chat_payload,
)
from draftsmith.generate.dispatch import Dispatcher, Endpoint
from draftsmith.generate.config import GenerateConfig, GenerateSummary
from draftsmith.generate.guard import QualityGuard
from draftsmith.data.generated import generated_row, incomplete_answer
from draftsmith.data.prompts import PromptSample, load_prompts
from draftsmith.generate.inputs import shard_of
from draftsmith.core.asyncrun import run_async
from draftsmith.generate.store import (
    OutputStore,
    check_own_files,
    count_row_ids,
    manifest_lock,
    own_file_names,
    shard_tag,
)



class QualityGuardTripped(DraftsmithError):
    """The quality guard stopped the run (the CLI exits with code 3)."""

    exit_code = 3


class _Run:
    """The scheduler of one run: a ready queue, least-outstanding dispatch, retries, the guard."""

    def __init__(self, config: GenerateConfig, client: ChatClient, store: OutputStore, model: str,
                 progress: Progress, guard: QualityGuard, log: Callable[[str], None]):
        self.config = config
        self.client = client
        self.store = store
        self.model = model
        self.progress = progress
        self.guard = guard
        self.log = log
        self.ready: deque[PromptSample] = deque()
        self.unresolved: set[str] = set()
        self.attempts: dict[str, int] = {}
        self.connection_errors: dict[str, int] = {}
        self.tries: dict[str, int] = {}  # requests of a sample that came back (cancelled ones do not count)
        self.inflight: dict[asyncio.Task, tuple[PromptSample, Endpoint, float]] = {}
        self.timers = 0
        self.wake = asyncio.Event()
        self.stopping = False
        self.stop_reason: str | None = None
        self.guard_tripped = False
        self.done = self.failed = self.retries = self.requeued = 0
        self.output_tokens = 0
        self.mean_completion = float(config.max_tokens) / 2
        self.return_token_ids = config.return_token_ids
        self.dispatcher = Dispatcher(
            config.endpoints,
            config.concurrency,
            client,
            health_interval_s=config.health_interval_s,
            health_timeout_s=config.health_timeout_s,
            on_down=self._on_endpoint_down,
            on_change=self.wake.set,
            log=log,
        )
        self._base_payload = self._make_base_payload()
        self._flush_pending = False
        store.flush_soon = self._flush_soon

    def _flush_soon(self) -> None:
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        self.store.flush()

    # --- requests -----------------------------------------------------------------------------

    def _make_base_payload(self) -> dict[str, Any]:
        config = self.config
        return chat_payload(
            self.model, config.max_tokens, stream=config.stream, temperature=config.temperature, top_p=config.top_p,
            seed=config.seed, chat_template_kwargs=config.chat_template_kwargs,
            return_token_ids=self.return_token_ids, extra_body=config.extra_body,
        )

    def _work(self, sample: PromptSample) -> float:
        return sample.prompt_chars / 4.0 + self.mean_completion

    async def _attempt(self, sample: PromptSample, endpoint: Endpoint) -> tuple[str, Any, float | None]:
        payload = dict(self._base_payload)
        payload["messages"] = sample.messages
        if sample.tools:
            payload["tools"] = sample.tools
        try:
            return "ok", await self.client.chat(endpoint.url, payload), None
        except EndpointConnectionError as error:
            return "connection", error, None
        except (RequestTimeout, IncompleteResponse) as error:
            return "retry", error, None
        except HTTPStatusError as error:
            return ("retry" if error.retryable else "fail"), error, error.retry_after
        except ResponseFormatError as error:
            return "fail", error, None

    def _launch(self, sample: PromptSample, endpoint: Endpoint) -> None:
        work = self._work(sample)
        self.dispatcher.begin(endpoint, work)
        task = asyncio.get_running_loop().create_task(self._attempt(sample, endpoint))
        self.inflight[task] = (sample, endpoint, work)
        endpoint.inflight.add(task)
        task.add_done_callback(self._on_done)

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        delay = min(self.config.backoff_max_s, self.config.backoff_base_s * (2 ** max(0, attempt - 1)))
        delay *= random.uniform(0.5, 1.5)  # jitter: retries from many requests do not arrive together
        if retry_after is not None:  # the server's wish, but never past --backoff-max-s (nor inf)
            delay = max(delay, min(retry_after, self.config.backoff_max_s))
        return delay

    def _schedule(self, sample: PromptSample, delay: float) -> None:
        self.timers += 1

        def fire() -> None:
            self.timers -= 1
            if not self.stopping:
                self.ready.append(sample)
            self.wake.set()

        asyncio.get_running_loop().call_later(delay, fire)

    def _on_endpoint_down(self, endpoint: Endpoint) -> None:
        for task in list(endpoint.inflight):
            task.cancel()

    def _on_done(self, task: asyncio.Task) -> None:
        sample, endpoint, work = self.inflight.pop(task)
        endpoint.inflight.discard(task)
        self.dispatcher.end(endpoint, work)
        self.wake.set()
        if task.cancelled():
            if not self.stopping:
                self.requeued += 1
                self.ready.appendleft(sample)
            return
        try:
            kind, value, retry_after = task.result()
        except Exception as error:  # a bug, not the endpoint's fault: record it, never drop the sample
            kind, value, retry_after = "fail", error, None
        self.tries[sample.id] = self.tries.get(sample.id, 0) + 1
        if self.stopping:
            if kind == "ok":
                self._complete(sample, endpoint, value)
            return
        if kind == "ok":
            endpoint.completed += 1
            self._complete(sample, endpoint, value)
        elif kind == "connection":
            endpoint.failed += 1
            self.dispatcher.suspect(endpoint, str(value))
            count = self.connection_errors.get(sample.id, 0) + 1
            self.connection_errors[sample.id] = count
            if count > 2 * self.config.max_retries:
                self._fail(sample, f"connection failed {count} times, last: {value}", endpoint)
            else:
                self.retries += 1
                self.progress.fields["retries"] = self.progress.fields.get("retries", 0) + 1
                self._schedule(sample, self._backoff(count, None) / 4)
        elif kind == "retry":
            endpoint.failed += 1
            count = self.attempts.get(sample.id, 0) + 1
            self.attempts[sample.id] = count
            if count > self.config.max_retries:
                self._fail(sample, f"gave up after {count} attempts, last: {value}", endpoint)
            else:
                self.retries += 1
                self.progress.fields["retries"] = self.progress.fields.get("retries", 0) + 1
                self._schedule(sample, self._backoff(count, retry_after))
        else:
            message = str(value)
            if self.return_token_ids and "return_token_ids" in message:
                self.log("the engine rejects 'return_token_ids'; continuing without token ids")
                self.return_token_ids = False
                self._base_payload.pop("return_token_ids", None)
                self.ready.appendleft(sample)
                return
            self._fail(sample, message, endpoint)

    def _fail(self, sample: PromptSample, reason: str, endpoint: Endpoint | None) -> None:
        reason = redact(reason)  # an unexpected error's text may quote the URL it was sent to
        self.store.write_failure(sample.id, reason, self.tries.get(sample.id, 0), endpoint.label if endpoint else None)
        self.unresolved.discard(sample.id)
        self.failed += 1
        self.progress.failed += 1

    def _complete(self, sample: PromptSample, endpoint: Endpoint, result: ChatResult) -> None:
        completion_tokens = result.completion_tokens
        if completion_tokens is None and result.completion_token_ids is not None:
            completion_tokens = len(result.completion_token_ids)
        # None (no think block) is not "" (an empty block the model wrote): tokenize trains the
        # latter and leaves the former to the template, so a thinking-off row must say None.
        reasoning = None if result.reasoning_source == "none" else result.reasoning
        row = generated_row(
            sample.id, sample.messages, result.content, reasoning, sample.tools,
            tool_calls=result.tool_calls,
            finish_reason=result.finish_reason,
            prompt_tokens=result.prompt_tokens,
            completion_tokens=completion_tokens,
            reasoning_tokens=result.reasoning_tokens,
            prompt_token_ids=result.prompt_token_ids,
            completion_token_ids=result.completion_token_ids,
            model=result.model or self.model,
            endpoint=endpoint.label,
            latency_s=round(result.latency_s, 4),
        )
        problem = incomplete_answer(row)
        if problem is not None:  # the client refuses these already; never write one as an answer
            self._fail(sample, f"not a complete answer: {problem}", endpoint)
            return
        if not self.store.write_row(row):
            return  # a requeued copy finished too: the first complete row wins
        self.unresolved.discard(sample.id)
        self.done += 1
        tokens = completion_tokens or 0
        self.output_tokens += tokens
        self.mean_completion += (tokens - self.mean_completion) / min(self.done, 1000)
        self.progress.advance(1, tokens=tokens)
        trip = self.guard.observe(result.content, result.reasoning, result.finish_reason)
        if trip is not None:
            self.guard_tripped = True
            self._stop(trip.message() + f" -- stopped after {self.done} rows; the rows so far are kept")

    def _stop(self, reason: str) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.stop_reason = reason
        for task in list(self.inflight):
            task.cancel()
        self.wake.set()

    # --- main loop ------------------------------------------------------------------------------

    async def _wait(self, timeout: float = 1.0) -> None:
        try:
            await asyncio.wait_for(self.wake.wait(), timeout)
        except asyncio.TimeoutError:
            pass
        self.wake.clear()

    async def _ticker(self) -> None:
        while True:
            await asyncio.sleep(0.5)
            self.progress.fields["endpoints up"] = f"{self.dispatcher.healthy_count}/{len(self.dispatcher.endpoints)}"
            if self.guard.seen:
                shares = self.guard.shares()
                self.progress.fields["empty answer"] = f"{shares['empty_answer']:.0%}"
                self.progress.fields["length"] = f"{shares['length']:.0%}"
            self.progress.tick()

    async def run(self, samples: list[PromptSample]) -> None:
        self.ready.extend(samples)
        self.unresolved.update(sample.id for sample in samples)
        self.dispatcher.start()
        ticker = asyncio.get_running_loop().create_task(self._ticker())
        try:
            while not self.stopping:
                if not self.ready:
                    if not self.inflight and self.timers == 0:
                        break
                    await self._wait()
                    continue
                endpoint = self.dispatcher.pick()
                if endpoint is None:
                    since = self.dispatcher.all_down_since()
                    if since is not None and time.monotonic() - since > self.config.endpoint_wait_s:
                        reasons = "; ".join(f"{e.label}: {e.last_error}" for e in self.dispatcher.endpoints)
                        self._stop(f"no endpoint healthy for {self.config.endpoint_wait_s:g}s ({reasons})")
                        break
                    await self._wait()
                    continue
                self._launch(self.ready.popleft(), endpoint)
        except asyncio.CancelledError:
            self._stop("interrupted")
            raise
        finally:
            self.stopping = True
            for task in list(self.inflight):
                task.cancel()
            if self.inflight:
                await asyncio.gather(*self.inflight, return_exceptions=True)
            ticker.cancel()
            await self.dispatcher.stop()


def _verify_on_disk(summary: GenerateSummary, store: OutputStore, samples: list[PromptSample]) -> None:
    """Rescan the output: every sample counted done must be there, once."""
    counts = count_row_ids(store.directory)
    mine = [counts.get(sample.id, 0) for sample in samples]
    summary.on_disk = sum(1 for count in mine if count)
    summary.duplicates_on_disk = sum(count - 1 for count in mine if count > 1)


def _order(samples: list[PromptSample], order: str) -> list[PromptSample]:
    if order == "longest-first":
        return sorted(samples, key=lambda s: -s.prompt_chars)
    if order == "prefix":
        return sorted(samples, key=lambda s: s.prefix_key())
    return samples


async def _wait_for_endpoints(dispatcher: Dispatcher, wait_s: float, log) -> None:
    deadline = time.monotonic() + wait_s
    last_log = 0.0
    while True:
        await dispatcher.check_all()
        if dispatcher.healthy_count:
            return
        now = time.monotonic()
        reasons = "; ".join(f"{e.label}: {e.last_error}" for e in dispatcher.endpoints)
        if now >= deadline:
            raise DraftsmithError(f"no endpoint became healthy within {wait_s:g}s ({reasons})")
        if now - last_log > 10:
            log(f"waiting for an endpoint to become healthy ({reasons})")
            last_log = now
        await asyncio.sleep(min(1.0, max(0.05, deadline - now)))


async def _discover_model(client: ChatClient, dispatcher: Dispatcher) -> str:
    for endpoint in dispatcher.endpoints:
        if not endpoint.healthy:
            continue
        try:
            status, body = await client.get_json(endpoint.url + "/v1/models")
        except EndpointConnectionError:
            continue
        if status == 200 and isinstance(body, dict) and body.get("data"):
            return str(body["data"][0]["id"])
    raise DraftsmithError("could not read a model name from /v1/models; pass --model NAME")


async def agenerate(config: GenerateConfig, log: Callable[[str], None] | None = None) -> GenerateSummary:
    """Run generation (async). Returns the summary; raises ``InputError`` for bad input.

    A tripped quality guard does not raise here: ``summary.guard_tripped`` and
    ``summary.stopped_reason`` say what happened (the CLI turns it into exit code 3).
    """
    config.check_run()
    require_output_dir(config.output_dir, "--output")
    # One writer per shard of an output directory: two runs of one shard would duplicate rows, while
    # different shards (other nodes) may share the directory.
    tag = shard_tag(config.shard_index, config.shard_count)
    check_own_files(Path(config.output_dir), own_file_names(tag))  # before the lock file is even opened
    with lock_directory(config.output_dir, f"generate shard {config.shard_index}/{config.shard_count}",
                        lock_file=Path(config.output_dir) / f".draftsmith.{tag}.lock"):
        return await _agenerate(config, log)


async def _agenerate(config: GenerateConfig, log: Callable[[str], None] | None) -> GenerateSummary:
    from rich.console import Console

    console = Console(stderr=True)
    if log is None:
        def log(message: str) -> None:
            console.print(f"[dim]draftsmith generate:[/] {message}", highlight=False)

    started = time.monotonic()
    samples, duplicate_ids = load_prompts(config.inputs, config.split)
    if not samples:
        shown = config.inputs if isinstance(config.inputs, (str, Path)) else ", ".join(map(str, config.inputs))
        raise InputError(f"{shown}: no prompts (the input is empty)")
    count = config.shard_count
    if count > 1:
        samples = [s for s in samples if shard_of(s.id, count) == config.shard_index]
        duplicate_ids = [i for i in duplicate_ids if shard_of(i, count) == config.shard_index]
    store = OutputStore(config.output_dir, config.shard_index, count, config.fsync_interval_s, log=log)
    done_ids = store.scan()
    previous_failures = store.previous_failures()
    already_done = [s for s in samples if s.id in done_ids]
    todo = [s for s in samples if s.id not in done_ids]
    skipped_failed = 0
    if not config.retry_failed:
        before = len(todo)
        todo = [s for s in todo if s.id not in previous_failures]
        skipped_failed = before - len(todo)
    todo = _order(todo, config.order)
    beyond_limit = 0
    if config.limit is not None and len(todo) > config.limit:
        beyond_limit = len(todo) - config.limit
        todo = todo[: config.limit]
    total_input = len(samples) + len(duplicate_ids)
    if already_done:
        log(f"resuming: {len(already_done):,} of {len(samples):,} samples already generated in {store.directory}")

    summary = GenerateSummary(
        input=total_input, done=0, failed=0,
        skipped=len(already_done) + len(duplicate_ids) + skipped_failed,
        remaining=len(todo) + beyond_limit, already_done=len(already_done), duplicates=len(duplicate_ids),
        skipped_failed=skipped_failed, output_dir=str(store.directory), model=config.model,
        failures_file=str(store.directory / f"failures-{store.tag}.jsonl"),
    )
    if not todo:
        _verify_on_disk(summary, store, samples)
        store.write_summary(summary.to_dict())
        return summary

    guard_config = config.guard
    if config.chat_template_kwargs.get("enable_thinking") is False and guard_config.expect_reasoning:
        guard_config = guard_config.model_copy(update={"expect_reasoning": False})
    guard = QualityGuard(guard_config)
    progress = Progress("generate", len(todo), unit="samples", token_unit="out tok", enabled=config.progress,
                        console=console)
    connections = config.concurrency * len(config.endpoints) + 8
    api_key = config.api_key or os.environ.get("OPENAI_API_KEY")
    async with ChatClient(connections=connections, timeout_s=config.request_timeout_s, api_key=api_key) as client:
        probe = Dispatcher(config.endpoints, config.concurrency, client, health_timeout_s=config.health_timeout_s,
                           log=log)
        await _wait_for_endpoints(probe, config.endpoint_wait_s, log)
        model = config.model or await _discover_model(client, probe)
        with manifest_lock(store.directory):  # shards share the directory: --shard i/N needs one N
            check_manifest(store.directory, "generate", config.output_settings(model), force=config.force_resume,
                           log=log)
        run = _Run(config, client, store, model, progress, guard, log)
        for fresh, checked in zip(run.dispatcher.endpoints, probe.endpoints):
            fresh.healthy, fresh.last_error = checked.healthy, checked.last_error
            fresh.down_since = None if checked.healthy else time.monotonic()
        store.open()
        try:
            with progress:
                await run.run(todo)
        finally:
            store.close()
            elapsed = time.monotonic() - started
            summary.done = run.done
            summary.failed = run.failed
            summary.remaining = len(run.unresolved) + beyond_limit
            summary.retries = run.retries
            summary.requeued = run.requeued
            summary.output_tokens = run.output_tokens
            summary.elapsed_s = round(elapsed, 3)
            summary.output_tokens_per_s = round(run.output_tokens / elapsed, 2) if elapsed > 0 else 0.0
            summary.stopped_reason = run.stop_reason
            summary.guard_tripped = run.guard_tripped
            summary.model = model
            summary.rows_file = str(store.rows_path) if store.rows_path and store.rows_path.exists() else None
            summary.endpoints = [
                {"url": e.label, "healthy": e.healthy, "completed": e.completed, "errors": e.failed,
                 "last_error": e.last_error}
                for e in run.dispatcher.endpoints
            ]
            _verify_on_disk(summary, store, samples)
            store.write_summary(summary.to_dict())
    return summary


def generate(config: GenerateConfig, log: Callable[[str], None] | None = None) -> GenerateSummary:
    """Run generation to completion and return its summary (blocking).

    Works inside Jupyter too: with an event loop already running, the run gets its own loop in a
    worker thread.
    """
    return run_async(agenerate(config, log))
