"""The run itself: one worker task per endpoint slot, all pulling samples from one queue.

Each endpoint gets `--concurrency` workers inside one `asyncio.TaskGroup`. A worker takes the next
sample, sends it to its own endpoint, and on a retryable error sleeps its backoff and tries again;
so an endpoint that answers faster pulls more work (least-outstanding balancing falls out of
pulling), and a slow one is never handed more than it can take. When an endpoint goes down (a
refused connection confirmed by its health check, or a hung `/health`), its in-flight requests
are cancelled and their samples go back to the front of the queue for the other endpoints; its
workers wait until it is back. The run ends when every sample is written or failed, when the
quality guard trips, when no endpoint has been healthy for `--endpoint-wait`, or on Ctrl-C /
SIGTERM (then finished rows are kept and the rest resume on the next run).
"""

from __future__ import annotations

import asyncio
import itertools
import random
import time
from typing import Any, Callable

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
from draftsmith.core.progress import Progress
from draftsmith.core.redact import redact
from draftsmith.data.generated import generated_row, incomplete_answer
from draftsmith.data.prompts import PromptSample
from draftsmith.generate.config import GenerateConfig
from draftsmith.generate.dispatch import Dispatcher, Endpoint, InFlight
from draftsmith.generate.guard import QualityGuard
from draftsmith.generate.store import OutputStore

REQUEUED, FRESH, STOP = 0, 1, -1  # queue priorities: requeued samples first, stop markers before all


class GenerationRun:
    """One run over a list of samples: the workers, their shared queue, retries and the guard."""

    def __init__(self, config: GenerateConfig, client: ChatClient, store: OutputStore, model: str,
                 progress: Progress, guard: QualityGuard, log: Callable[[str], None]):  # fmt: skip
        self.config, self.client, self.store, self.model = config, client, store, model
        self.progress, self.guard, self.log = progress, guard, log
        self.queue: asyncio.PriorityQueue = asyncio.PriorityQueue()
        self._order = itertools.count()
        self.unresolved: set[str] = set()
        self.attempts: dict[str, int] = {}
        self.connection_errors: dict[str, int] = {}
        self.tries: dict[str, int] = {}  # requests of a sample that came back (cancelled ones do not count)
        self.stopping = False  # stopped before every sample was resolved (guard, no endpoint, Ctrl-C)
        self.closing = False  # the workers are told to finish (every sample resolved, or stopping)
        self.stop_reason: str | None = None
        self.guard_tripped = False
        self.done = self.failed = self.retries = self.requeued = 0
        self.output_tokens = 0
        self.return_token_ids = config.return_token_ids
        self._changed = asyncio.Event()
        self.dispatcher = Dispatcher(
            config.endpoints, config.concurrency or 32, client, health_interval_s=config.health_interval_s,
            health_timeout_s=config.health_timeout_s, on_down=self._cancel_stalled, on_change=self._wake, log=log,
        )  # fmt: skip
        self._base_payload = chat_payload(
            model, config.max_tokens, stream=config.stream, temperature=config.temperature, top_p=config.top_p,
            seed=config.seed, chat_template_kwargs=config.chat_template_kwargs,
            return_token_ids=self.return_token_ids, extra_body=config.extra_body,
        )  # fmt: skip
        self._flush_pending = False
        store.flush_soon = self._flush_soon

    # --- the run --------------------------------------------------------------------------------

    async def run(self, samples: list[PromptSample]) -> None:
        for sample in samples:
            self._put(FRESH, sample)
        self.unresolved.update(sample.id for sample in samples)
        self.dispatcher.start()
        watcher = asyncio.get_running_loop().create_task(self._watch())
        try:
            async with asyncio.TaskGroup() as workers:
                for endpoint in self.dispatcher.endpoints:
                    for _ in range(endpoint.capacity):
                        workers.create_task(self._worker(endpoint))
        except asyncio.CancelledError:
            self._stop("interrupted")
            raise
        except BaseExceptionGroup as errors:  # a worker's error (a full disk, a bug): the first, as itself
            self._stop("stopped by an error")
            raise _first_error(errors) from None
        finally:
            watcher.cancel()
            await self.dispatcher.stop()

    async def _worker(self, endpoint: Endpoint) -> None:
        while not self.closing:
            if not endpoint.healthy:
                await self._until_changed()
                continue
            priority, _, sample = await self.queue.get()
            if priority == STOP or self.stopping:
                return
            if not endpoint.healthy:  # went down while this worker waited: the sample goes to the others
                self._put(REQUEUED, sample)
                continue
            await self._serve(sample, endpoint)

    async def _serve(self, sample: PromptSample, endpoint: Endpoint) -> None:
        """Send one sample to `endpoint` until it is written, failed, or handed back to the queue."""
        while True:
            outcome = await self._request(sample, endpoint)
            if outcome is None:  # cancelled: the endpoint went down, or the run stops
                if not self.stopping:
                    self.requeued += 1
                    self._put(REQUEUED, sample)
                return
            kind, value, retry_after = outcome
            self.tries[sample.id] = self.tries.get(sample.id, 0) + 1
            if kind == "ok":
                endpoint.completed += 1
                self._complete(sample, endpoint, value)
                return
            if self.stopping:
                return
            if kind == "fail" and self._drop_token_ids_if_refused(str(value)):
                continue
            delay = self._retry_delay(sample, endpoint, kind, value, retry_after)
            if delay is None:
                return
            await asyncio.sleep(delay)
            if self.stopping:
                return
            if kind == "connection" or not endpoint.healthy:
                self._put(REQUEUED, sample)  # the endpoint is suspect: whichever worker is free takes it
                return

    async def _request(self, sample: PromptSample, endpoint: Endpoint) -> tuple[str, Any, float | None] | None:
        """One request as its own task, so that an endpoint going down can cancel it (None then)."""
        endpoint.outstanding += 1
        state = InFlight(sent=time.monotonic())
        request = asyncio.get_running_loop().create_task(self._attempt(sample, endpoint, state))
        endpoint.inflight[request] = state
        try:
            await asyncio.wait({request})
        except asyncio.CancelledError:  # this worker is cancelled (the run is interrupted)
            request.cancel()
            raise
        finally:
            endpoint.inflight.pop(request, None)
            endpoint.outstanding -= 1
        if request.cancelled():
            return None
        try:
            outcome = request.result()
        except Exception as error:  # a bug, not the endpoint's fault: record it, never drop the sample
            return "fail", error, None
        if outcome[0] != "connection":  # an answer of some kind came back
            self.dispatcher.answered(endpoint, state)
        return outcome

    async def _attempt(self, sample: PromptSample, endpoint: Endpoint, state: InFlight) -> tuple[str, Any, float | None]:
        payload = {**self._base_payload, "messages": sample.messages}
        if sample.tools:
            payload["tools"] = sample.tools
        seen = self.dispatcher.seen
        try:
            return "ok", await self.client.chat(endpoint.url, payload, on_progress=lambda: seen(endpoint, state)), None
        except EndpointConnectionError as error:
            return "connection", error, None
        except (RequestTimeout, IncompleteResponse) as error:
            return "retry", error, None
        except HTTPStatusError as error:
            return ("retry" if error.retryable else "fail"), error, error.retry_after
        except ResponseFormatError as error:
            return "fail", error, None

    # --- outcomes -------------------------------------------------------------------------------

    def _retry_delay(self, sample: PromptSample, endpoint: Endpoint, kind: str, value: Any,
                     retry_after: float | None) -> float | None:  # fmt: skip
        """Seconds to sleep before the next try, or None when the sample has failed for good."""
        if kind == "fail":  # the request's own fault (a 4xx, a malformed reply), not the endpoint's
            self._fail(sample, str(value), endpoint)
            return None
        endpoint.failed += 1
        if kind == "connection":
            self.dispatcher.suspect(endpoint, str(value))
            count = self.connection_errors[sample.id] = self.connection_errors.get(sample.id, 0) + 1
            if count > 2 * self.config.max_retries:
                self._fail(sample, f"connection failed {count} times, last: {value}", endpoint)
                return None
            delay = self._backoff(count, None) / 4
        else:
            count = self.attempts[sample.id] = self.attempts.get(sample.id, 0) + 1
            if count > self.config.max_retries:
                self._fail(sample, f"gave up after {count} attempts, last: {value}", endpoint)
                return None
            delay = self._backoff(count, retry_after)
        self.retries += 1
        self.progress.fields["retries"] = self.progress.fields.get("retries", 0) + 1
        return delay

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        delay = min(self.config.backoff_max_s, self.config.backoff_base_s * (2 ** max(0, attempt - 1)))
        delay *= random.uniform(0.5, 1.5)  # jitter: retries from many requests do not arrive together
        if retry_after is not None:  # the server's wish, but never past --backoff-max-s (nor inf)
            delay = max(delay, min(retry_after, self.config.backoff_max_s))
        return delay

    def _drop_token_ids_if_refused(self, message: str) -> bool:
        if not (self.return_token_ids and "return_token_ids" in message):
            return False
        if self._base_payload.pop("return_token_ids", None) is not None:
            self.log("the engine rejects 'return_token_ids'; continuing without token ids")
        self.return_token_ids = False
        return True

    def _fail(self, sample: PromptSample, reason: str, endpoint: Endpoint | None) -> None:
        reason = redact(reason)  # an unexpected error's text may quote the URL it was sent to
        self.store.write_failure(sample.id, reason, self.tries.get(sample.id, 0), endpoint.label if endpoint else None)
        self.failed += 1
        self.progress.failed += 1
        self._resolved(sample)

    def _complete(self, sample: PromptSample, endpoint: Endpoint, result: ChatResult) -> None:
        completion_tokens = result.completion_tokens
        if completion_tokens is None and result.completion_token_ids is not None:
            completion_tokens = len(result.completion_token_ids)
        # None (no think block) is not "" (an empty block the model wrote): tokenize trains the
        # latter and leaves the former to the template, so a thinking-off row must say None.
        reasoning = None if result.reasoning_source == "none" else result.reasoning
        row = generated_row(
            sample.id, sample.messages, result.content, reasoning, sample.tools, tool_calls=result.tool_calls,
            finish_reason=result.finish_reason, prompt_tokens=result.prompt_tokens, completion_tokens=completion_tokens,
            reasoning_tokens=result.reasoning_tokens, prompt_token_ids=result.prompt_token_ids,
            completion_token_ids=result.completion_token_ids, model=result.model or self.model, endpoint=endpoint.label,
            latency_s=round(result.latency_s, 4),
        )  # fmt: skip
        problem = incomplete_answer(row)
        if problem is not None:  # the client refuses these already; never write one as an answer
            self._fail(sample, f"not a complete answer: {problem}", endpoint)
            return
        if not self.store.write_row(row):
            return  # a requeued copy finished too: the first complete row wins
        self.done += 1
        tokens = completion_tokens or 0
        self.output_tokens += tokens
        self.progress.advance(1, tokens=tokens)
        self._resolved(sample)
        trip = self.guard.observe(result.content, result.reasoning, result.finish_reason)
        warning = self.guard.length_warning(self.config.max_tokens)
        if warning is not None:
            self.log(warning)
        if trip is not None and not self.stopping:
            self.guard_tripped = True
            self._stop(trip.message() + f" -- stopped after {self.done} rows; the rows so far are kept")

    def _resolved(self, sample: PromptSample) -> None:
        self.unresolved.discard(sample.id)
        if not self.unresolved:
            self._release_workers()

    # --- stopping and waking ----------------------------------------------------------------------

    def _put(self, priority: int, sample: PromptSample | None) -> None:
        self.queue.put_nowait((priority, next(self._order), sample))

    def _release_workers(self) -> None:
        self.closing = True
        for _ in range(sum(endpoint.capacity for endpoint in self.dispatcher.endpoints)):
            self._put(STOP, None)
        self._wake()

    def _stop(self, reason: str) -> None:
        if self.stopping:
            return
        self.stopping, self.stop_reason = True, reason
        for endpoint in self.dispatcher.endpoints:
            for request in list(endpoint.inflight):
                request.cancel()
        self._release_workers()

    def _cancel_stalled(self, endpoint: Endpoint) -> None:
        """The endpoint went down: its requests that are not progressing go back to the queue (a
        stream still producing tokens runs on; it ends on its own, answered or failed)."""
        for request in self.dispatcher.stalled(endpoint):
            request.cancel()

    def _wake(self) -> None:
        # Every waiter holds the event it waited on; a fresh one for the next wait.
        self._changed.set()
        self._changed = asyncio.Event()

    async def _until_changed(self, timeout: float = 1.0) -> None:
        try:
            await asyncio.wait_for(self._changed.wait(), timeout)
        except asyncio.TimeoutError:
            pass

    async def _watch(self) -> None:
        """Progress fields, and the stop when no endpoint has been healthy for --endpoint-wait."""
        while True:
            await asyncio.sleep(0.5)
            dispatcher = self.dispatcher
            since = dispatcher.all_down_since()
            if since is not None and time.monotonic() - since > self.config.endpoint_wait_s:
                reasons = "; ".join(f"{e.label}: {e.last_error}" for e in dispatcher.endpoints)
                self._stop(f"no endpoint healthy for {self.config.endpoint_wait_s:g}s ({reasons})")
            self.progress.fields["endpoints up"] = f"{dispatcher.healthy_count}/{len(dispatcher.endpoints)}"
            if self.guard.seen:
                shares = self.guard.shares()
                self.progress.fields["empty answer"] = f"{shares['empty_answer']:.0%}"
                self.progress.fields["length"] = f"{shares['length']:.0%}"
            self.progress.tick()

    def _flush_soon(self) -> None:
        if not self._flush_pending:
            self._flush_pending = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_pending = False
        self.store.flush()


def _first_error(errors: BaseExceptionGroup) -> BaseException:
    """The first leaf of an exception group that is not a cancellation."""
    for error in errors.exceptions:
        if isinstance(error, BaseExceptionGroup):
            return _first_error(error)
        if not isinstance(error, asyncio.CancelledError):
            return error
    return errors.exceptions[0]
