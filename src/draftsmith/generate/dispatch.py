"""The endpoints of a run and whether each is alive.

Every endpoint (one engine = one GPU or node) has a concurrency cap: the number of workers that
pull samples for it (`workers.py`), by default the number of requests the engine runs at once (its
slots, `client.chat.engine_slots`).

An endpoint is judged by everything it answers, its requests first, not by one probe: a real
engine under load answers ``/health`` slowly (llama-server queues it behind requests waiting for a
slot), and that is not death. Any answer from it (a response, a streamed chunk, a health answer,
even an error status) is a sign of life. It is marked down only when

* it refuses connections: a request's connection error, confirmed by a health check that cannot
  connect either, or a health check that answers "not ready" (non-200); or
* it is hung: two health checks in a row went unanswered (each waits ``health_timeout_s``, 30 s:
  a CPU-starved llama-server took 16 s to answer one) and nothing else came back from it for that
  long, nor for twice the longest request it has answered. While it holds more requests than its
  slots, before it answered one, only the requests' own timeout decides (an engine whose HTTP
  threads are all held by waiting requests answers no check until one finishes).

Going down cancels only its requests that are not progressing (no sign of life from them within
``health_timeout_s``); a stream still producing tokens runs on. The rest are requeued by the
caller (``on_down``). A down endpoint is re-checked every ``health_interval_s`` until it answers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from draftsmith.client.chat import AnswerTimeout, ChatClient, EndpointConnectionError, normalize_base_url
from draftsmith.core.redact import redact_url


@dataclass
class InFlight:
    """One request on an endpoint: when it was sent and when it last showed progress."""

    sent: float
    last_progress: float | None = None


@dataclass
class Endpoint:
    """One OpenAI-compatible server."""

    url: str
    capacity: int
    healthy: bool = True
    outstanding: int = 0
    completed: int = 0
    failed: int = 0
    down_since: float | None = None
    last_error: str | None = None
    inflight: dict = field(default_factory=dict)
    """The asyncio tasks currently running a request on this endpoint -> their `InFlight`."""
    label: str = ""
    """`url` as shown in rows, files and logs: credentials in it masked."""
    slots: int | None = None
    """Requests the engine runs at once, where it says (llama-server's /props, vLLM's max_num_seqs)."""
    last_seen: float = field(default_factory=time.monotonic)
    """When anything last came back from it: a response, a chunk, a health answer."""
    unanswered_checks: int = 0
    """Health checks in a row that got no answer (reset by any sign of life)."""
    longest_request_s: float = 0.0
    """The longest request it has answered (the patience of a hang verdict while it queues)."""
    checking: bool = False

    def __post_init__(self) -> None:
        self.label = redact_url(self.url)

    @property
    def queueing(self) -> bool:
        """More requests on it than it runs at once: the rest, and a health check, wait in its queue."""
        return self.slots is not None and self.outstanding > self.slots


class Dispatcher:
    """Tracks whether each endpoint is alive.

    ``on_down(endpoint)`` is called once when an endpoint is marked down (the pipeline cancels and
    requeues its requests that are not progressing, see `stalled`); ``on_change()`` whenever
    capacity may have become free.
    """

    def __init__(
        self,
        urls: list[str],
        concurrency: int,
        client: ChatClient,
        health_interval_s: float = 10.0,
        health_timeout_s: float = 5.0,
        on_down: Callable[[Endpoint], None] | None = None,
        on_change: Callable[[], None] | None = None,
        log: Callable[[str], None] = lambda message: None,
    ):
        if not urls:
            raise ValueError("at least one endpoint is needed")
        seen = []
        for url in urls:
            base = normalize_base_url(url)
            if base not in seen:
                seen.append(base)
        self.endpoints = [Endpoint(url=base, capacity=max(1, concurrency)) for base in seen]
        self.client = client
        self.health_interval_s = health_interval_s
        self.health_timeout_s = health_timeout_s
        """A health check unanswered within this counts as unanswered (two in a row, with nothing
        else from the endpoint meanwhile, make it hung)."""
        self.on_down = on_down or (lambda endpoint: None)
        self.on_change = on_change or (lambda: None)
        self.log = log
        self._task: asyncio.Task | None = None
        self._checks: set[asyncio.Task] = set()

    @property
    def healthy_count(self) -> int:
        return sum(1 for endpoint in self.endpoints if endpoint.healthy)

    def all_down_since(self) -> float | None:
        """When the last healthy endpoint went down, or None while one is up."""
        if self.healthy_count:
            return None
        return max(endpoint.down_since or time.monotonic() for endpoint in self.endpoints)

    # --- signs of life ----------------------------------------------------------------------------

    def seen(self, endpoint: Endpoint, request: InFlight | None = None) -> None:
        """Something came back from `endpoint` (from `request`, when given): it is not hung."""
        now = time.monotonic()
        endpoint.last_seen = now
        endpoint.unanswered_checks = 0
        if request is not None:
            request.last_progress = now

    def answered(self, endpoint: Endpoint, request: InFlight) -> None:
        """`request` got its whole answer (any status): how long requests take here sets the patience
        of a hang verdict while the endpoint queues."""
        self.seen(endpoint, request)
        endpoint.longest_request_s = max(endpoint.longest_request_s, time.monotonic() - request.sent)

    def stalled(self, endpoint: Endpoint) -> list[asyncio.Task]:
        """The endpoint's requests that showed no progress within ``health_timeout_s`` (every one of a
        request that has not answered yet; a stream producing tokens is progressing)."""
        now = time.monotonic()
        return [task for task, request in endpoint.inflight.items()
                if request.last_progress is None or now - request.last_progress > self.health_timeout_s]  # fmt: skip

    def hung(self, endpoint: Endpoint, now: float | None = None) -> str | None:
        """Why `endpoint` counts as hung, or None while it is alive (see the module's docstring)."""
        if endpoint.unanswered_checks < 2:
            return None
        silent = (time.monotonic() if now is None else now) - endpoint.last_seen
        if endpoint.queueing and not endpoint.longest_request_s:
            return None  # its checks wait behind its first requests, still running: their timeout decides
        # Its requests may be silent as long as requests take here (a non-streamed answer says
        # nothing until it is whole).
        patience = max(self.health_timeout_s, 2 * endpoint.longest_request_s)
        if silent <= patience:
            return None
        return (f"hung: {endpoint.unanswered_checks} health checks unanswered and nothing from it for "
                f"{silent:.0f}s")

    # --- health ---------------------------------------------------------------------------------

    async def probe(self, endpoint: Endpoint) -> tuple[bool, str]:
        """One health check: ``/health`` must answer 200 (or, where it is 404, ``/v1/models``)."""
        try:
            timeout = self.health_timeout_s
            status, _ = await self.client.get_json(endpoint.url + "/health", timeout)
            if status == 404:
                status, _ = await self.client.get_json(endpoint.url + "/v1/models", timeout)
        except EndpointConnectionError as error:
            return False, str(error)
        return status == 200, f"health check answered HTTP {status}"

    async def check(self, endpoint: Endpoint, reason: str | None = None) -> None:
        """One health check of a running endpoint, judged as the module's docstring says."""
        if endpoint.checking:
            return
        endpoint.checking = True
        try:
            try:
                timeout = self.health_timeout_s
                status, _ = await self.client.get_json(endpoint.url + "/health", timeout)
                if status == 404:
                    status, _ = await self.client.get_json(endpoint.url + "/v1/models", timeout)
            except AnswerTimeout as error:
                endpoint.unanswered_checks += 1
                why = self.hung(endpoint)
                if why is not None:
                    self.mark_down(endpoint, f"{why} (last: {error})")
                return
            except EndpointConnectionError as error:  # refused, reset: nothing listens there
                self.mark_down(endpoint, f"{reason}; {error}" if reason else str(error))
                return
            self.seen(endpoint)
            if status == 200:
                self.mark_up(endpoint)
            else:
                why = f"health check answered HTTP {status}"
                self.mark_down(endpoint, f"{reason}; {why}" if reason else why)
        finally:
            endpoint.checking = False

    def mark_down(self, endpoint: Endpoint, reason: str) -> None:
        if not endpoint.healthy:
            endpoint.last_error = reason
            return
        endpoint.healthy = False
        endpoint.down_since = time.monotonic()
        endpoint.last_error = reason
        stalled = len(self.stalled(endpoint))
        running = len(endpoint.inflight) - stalled
        kept = f", {running} still producing run on" if running else ""
        self.log(f"endpoint {endpoint.label} is down ({reason}); requeueing its {stalled} stalled requests{kept}")
        self.on_down(endpoint)
        self.on_change()

    def mark_up(self, endpoint: Endpoint) -> None:
        if endpoint.healthy:
            return
        endpoint.healthy = True
        down_for = time.monotonic() - (endpoint.down_since or time.monotonic())
        endpoint.down_since = None
        self.log(f"endpoint {endpoint.label} is back after {down_for:.1f}s")
        self.on_change()

    def _spawn_check(self, endpoint: Endpoint, reason: str | None = None) -> None:
        task = asyncio.get_running_loop().create_task(self.check(endpoint, reason))
        self._checks.add(task)
        task.add_done_callback(self._checks.discard)

    def suspect(self, endpoint: Endpoint, reason: str) -> None:
        """A request on ``endpoint`` hit a connection error: check its health now (once at a time)."""
        if endpoint.healthy and not endpoint.checking:
            self._spawn_check(endpoint, reason)

    async def check_all(self) -> None:
        """Before the run: every endpoint must answer its health check within the timeout."""
        results = await asyncio.gather(*(self.probe(endpoint) for endpoint in self.endpoints))
        for endpoint, (ok, why) in zip(self.endpoints, results):
            if ok:
                self.seen(endpoint)
                self.mark_up(endpoint)
            else:
                self.mark_down(endpoint, why)

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            try:
                for endpoint in self.endpoints:  # each on its own: one slow answer delays no other
                    self._spawn_check(endpoint)
                    why = self.hung(endpoint) if endpoint.healthy else None
                    if why is not None:  # its last checks timed out and its requests still say nothing
                        self.mark_down(endpoint, why)
            finally:
                self.on_change()  # also wakes the scheduler to re-check its all-down deadline

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._health_loop())

    async def stop(self) -> None:
        tasks = [task for task in (self._task, *self._checks) if task is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            try:
                await task
            except asyncio.CancelledError:
                pass
        self._task = None
        self._checks.clear()
