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
import time
from pathlib import Path
from typing import Callable

from draftsmith.client.chat import ChatClient, EndpointConnectionError
from draftsmith.core.asyncrun import in_daemon_thread, run_async
from draftsmith.core.errors import DraftsmithError, InputError
from draftsmith.core.limits import workers_for
from draftsmith.core.lock import lock_directory
from draftsmith.core.manifest import check_manifest, read_manifest
from draftsmith.core.paths import require_output_dir
from draftsmith.core.progress import Progress
from draftsmith.core.redact import redact_url
from draftsmith.data.prompts import PromptSample, load_prompts
from draftsmith.data.thinking import choose_thinking, read_chat_template
from draftsmith.generate.config import GenerateConfig, GenerateSummary
from draftsmith.generate.dispatch import Dispatcher
from draftsmith.generate.guard import QualityGuard
from draftsmith.generate.inputs import shard_of
from draftsmith.generate.store import (
    OutputStore,
    check_own_files,
    count_row_ids,
    manifest_lock,
    own_file_names,
    shard_tag,
)
from draftsmith.generate.workers import GenerationRun


class QualityGuardTripped(DraftsmithError):
    """The quality guard stopped the run (the CLI exits with code 3)."""

    exit_code = 3


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


#: Requests in flight per endpoint where neither --concurrency nor the engine says how many.
DEFAULT_CONCURRENCY = 32


async def _fit_concurrency(client: ChatClient, dispatcher: Dispatcher, requested: int | None, todo: int, log) -> None:
    """Each endpoint's workers: what the engine runs at once (its slots) unless --concurrency says
    otherwise (asking for more is warned about: the rest wait in the engine's queue), 32 where the
    engine does not say; never more than there are samples to generate."""
    checked = [endpoint for endpoint in dispatcher.endpoints if endpoint.healthy]
    answers = await asyncio.gather(*(client.engine_slots(e.url, dispatcher.health_timeout_s) for e in checked))
    for endpoint, slots in zip(checked, answers):
        endpoint.slots = slots
    # An endpoint down at the start is most likely another copy of the same engine.
    fallback = next((endpoint.slots for endpoint in dispatcher.endpoints if endpoint.slots), None)
    for endpoint in dispatcher.endpoints:
        slots = endpoint.slots
        if requested is not None:
            wanted = requested
            if slots is not None and requested > slots:
                log(f"warning: --concurrency {requested} is more than the {slots} requests {endpoint.label} runs at "
                    f"once: {requested - slots} wait in its queue, and so do its health checks (while it queues, "
                    f"its requests alone say whether it is alive); leave --concurrency unset to send {slots}")
        elif slots is not None:
            wanted = slots
            log(f"concurrency {slots} on {endpoint.label}: the requests the engine runs at once (--concurrency to change)")
        else:
            wanted = fallback or DEFAULT_CONCURRENCY
            source = "as its fellow endpoints" if fallback else "the engine does not say how many requests it runs at once"
            log(f"concurrency {wanted} on {endpoint.label} ({source}; --concurrency to change)")
        endpoint.capacity = workers_for(wanted, todo)


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


def _local_template(config: GenerateConfig) -> str | None:
    if config.target is None:
        return None
    from draftsmith.core.paths import require_dir

    return read_chat_template(require_dir(config.target, "--target"))


async def _endpoint_template(client: ChatClient, dispatcher: Dispatcher) -> str | None:
    for endpoint in dispatcher.endpoints:
        if endpoint.healthy:
            template = await client.chat_template(endpoint.url)
            if template is not None:
                return template
    return None


def _finished_run_thinking(config: GenerateConfig, manifest: dict | None, log) -> GenerateConfig:
    """The thinking mode of a rerun with nothing left to send: no endpoint is asked for its template,
    so without --target or an explicit mode the run keeps the one its manifest recorded."""
    recorded = ((manifest or {}).get("settings") or {}).get("chat_template_kwargs")
    if config.target is not None or "enable_thinking" in config.chat_template_kwargs or not isinstance(recorded, dict):
        return _with_thinking_mode(config, _local_template(config), log)
    kwargs = dict(config.chat_template_kwargs)
    if "enable_thinking" in recorded:
        kwargs["enable_thinking"] = recorded["enable_thinking"]
    return config.model_copy(update={"chat_template_kwargs": kwargs})


def _with_thinking_mode(config: GenerateConfig, template: str | None, log) -> GenerateConfig:
    """The run's config with the thinking mode chosen (printed): the kwargs sent and recorded for
    resumes, and the guard's expectation of reasoning."""
    mode = choose_thinking(template, config.chat_template_kwargs)
    log(mode.line)
    guard = config.guard
    if guard.expect_reasoning and not mode.expect_reasoning:
        guard = guard.model_copy(update={"expect_reasoning": False})
    return config.model_copy(update={"chat_template_kwargs": mode.kwargs, "guard": guard})


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
    # Off the event loop: a prompts file that is a FIFO nobody writes blocks in open(), and only a free
    # loop lets the first Ctrl-C or SIGTERM stop the run there.
    samples, duplicate_ids = await in_daemon_thread(load_prompts, config.inputs, config.split)
    if not samples:
        shown = config.inputs if isinstance(config.inputs, (str, Path)) else ", ".join(map(str, config.inputs))
        raise InputError(f"{shown}: no prompts (the input is empty)")
    count = config.shard_count
    if count > 1:
        samples = [s for s in samples if shard_of(s.id, count) == config.shard_index]
        duplicate_ids = [i for i in duplicate_ids if shard_of(i, count) == config.shard_index]
    store = OutputStore(config.output_dir, config.shard_index, count, config.fsync_interval_s, log=log)
    already_done, todo, skipped_failed, beyond_limit = _work_left(config, samples, store)
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
        # Nothing to send, so no endpoint names the model: check the settings against the model the
        # manifest recorded, so another --shard N (or --max-tokens ...) is refused here too.
        manifest = read_manifest(store.directory)
        config = _finished_run_thinking(config, manifest, log)
        if manifest is not None:
            recorded_model = (manifest.get("settings") or {}).get("model")
            _check_output_settings(config, store, config.model or recorded_model, log)
        _verify_on_disk(summary, store, samples)
        store.write_summary(summary.to_dict())
        return summary

    progress = Progress("generate", len(todo), unit="samples", token_unit="out tok", enabled=config.progress,
                        console=console)
    api_key = config.api_key or os.environ.get("OPENAI_API_KEY")
    async with ChatClient(connections=2 * len(config.endpoints) + 8, timeout_s=config.request_timeout_s,
                          api_key=api_key) as setup:  # fmt: skip
        probe = Dispatcher(config.endpoints, config.concurrency or DEFAULT_CONCURRENCY, setup,
                           health_timeout_s=config.health_timeout_s, log=log)
        await _wait_for_endpoints(probe, config.endpoint_wait_s, log)
        model = config.model or await _discover_model(setup, probe)
        template = _local_template(config)
        config = _with_thinking_mode(config, template if config.target else await _endpoint_template(setup, probe), log)
        _check_output_settings(config, store, model, log)
        await _fit_concurrency(setup, probe, config.concurrency, len(todo), log)
    connections = sum(endpoint.capacity for endpoint in probe.endpoints) + 8
    async with ChatClient(connections=connections, timeout_s=config.request_timeout_s, api_key=api_key) as client:
        guard = QualityGuard(config.guard)
        run = GenerationRun(config, client, store, model, progress, guard, log)
        for fresh, checked in zip(run.dispatcher.endpoints, probe.endpoints):
            fresh.healthy, fresh.last_error = checked.healthy, checked.last_error
            fresh.down_since = None if checked.healthy else time.monotonic()
            fresh.capacity, fresh.slots = checked.capacity, checked.slots
        store.progress.begin(
            input=len(samples), already_done=len(already_done), skipped_failed=skipped_failed, todo=len(todo),
            settings={**config.output_settings(model), "endpoints": [redact_url(url) for url in config.endpoints],
                      "concurrency": [endpoint.capacity for endpoint in run.dispatcher.endpoints]},
        )  # fmt: skip
        store.open()
        try:
            with progress:
                await run.run(todo)
        finally:
            store.close()
            _record_run(summary, run, guard, store, time.monotonic() - started, beyond_limit)
            _verify_on_disk(summary, store, samples)
            store.write_summary(summary.to_dict())
    return summary


def _work_left(config: GenerateConfig, samples: list[PromptSample], store: OutputStore
               ) -> tuple[list[PromptSample], list[PromptSample], int, int]:
    """(already done, to do in --order, failed before and skipped, beyond --limit) of this shard's samples."""
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
    return already_done, todo, skipped_failed, beyond_limit


def _record_run(summary: GenerateSummary, run: GenerationRun, guard: QualityGuard, store: OutputStore, elapsed: float,
                beyond_limit: int) -> None:
    """What the run did, into its summary (also when it stopped early or failed)."""
    summary.done = run.done
    summary.failed = run.failed
    summary.remaining = len(run.unresolved) + beyond_limit
    summary.retries = run.retries
    summary.requeued = run.requeued
    summary.output_tokens = run.output_tokens
    summary.length_finished = guard.length_total
    summary.elapsed_s = round(elapsed, 3)
    summary.output_tokens_per_s = round(run.output_tokens / elapsed, 2) if elapsed > 0 else 0.0
    summary.stopped_reason = run.stop_reason
    summary.guard_tripped = run.guard_tripped
    summary.model = run.model
    summary.rows_file = str(store.rows_path) if store.rows_path and store.rows_path.exists() else None
    summary.endpoints = [
        {"url": e.label, "healthy": e.healthy, "completed": e.completed, "errors": e.failed, "last_error": e.last_error}
        for e in run.dispatcher.endpoints
    ]


def _check_output_settings(config: GenerateConfig, store: OutputStore, model: str | None, log) -> None:
    with manifest_lock(store.directory):  # shards share the directory: --shard i/N needs one N
        check_manifest(store.directory, "generate", config.output_settings(model), force=config.force_resume, log=log)


def generate(config: GenerateConfig, log: Callable[[str], None] | None = None) -> GenerateSummary:
    """Run generation to completion and return its summary (blocking).

    Works inside Jupyter too: with an event loop already running, the run gets its own loop in a
    worker thread.
    """
    return run_async(agenerate(config, log))
