"""The endpoints of a run and their health.

Every endpoint (one engine = one GPU or node) has a concurrency cap: the number of workers that
pull samples for it (`workers.py`). An endpoint whose request fails to connect, or whose
``/health`` check fails, is marked down: its in-flight requests are cancelled by the caller (see
``Endpoint.inflight``) and requeued, and it is re-checked every ``health_interval_s`` until it
answers again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from draftsmith.client.chat import ChatClient, EndpointConnectionError, normalize_base_url
from draftsmith.core.redact import redact_url


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
    inflight: set = field(default_factory=set)
    """The asyncio tasks currently running a request on this endpoint."""
    label: str = ""
    """`url` as shown in rows, files and logs: credentials in it masked."""

    def __post_init__(self) -> None:
        self.label = redact_url(self.url)


class Dispatcher:
    """Tracks endpoint health.

    ``on_down(endpoint)`` is called once when an endpoint is marked down (the pipeline cancels and
    requeues its in-flight requests); ``on_change()`` whenever capacity may have become free.
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
        """A hung engine (no answer to /health within this) counts as down."""
        self.on_down = on_down or (lambda endpoint: None)
        self.on_change = on_change or (lambda: None)
        self.log = log
        self._checking: set[str] = set()
        self._task: asyncio.Task | None = None

    @property
    def healthy_count(self) -> int:
        return sum(1 for endpoint in self.endpoints if endpoint.healthy)

    def all_down_since(self) -> float | None:
        """When the last healthy endpoint went down, or None while one is up."""
        if self.healthy_count:
            return None
        return max(endpoint.down_since or time.monotonic() for endpoint in self.endpoints)

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

    def mark_down(self, endpoint: Endpoint, reason: str) -> None:
        if not endpoint.healthy:
            return
        endpoint.healthy = False
        endpoint.down_since = time.monotonic()
        endpoint.last_error = reason
        self.log(f"endpoint {endpoint.label} is down ({reason}); requeueing its {endpoint.outstanding} requests")
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

    def suspect(self, endpoint: Endpoint, reason: str) -> None:
        """A request on ``endpoint`` hit a connection error: check its health now (once at a time)."""
        if not endpoint.healthy or endpoint.url in self._checking:
            return
        self._checking.add(endpoint.url)

        async def check() -> None:
            try:
                ok, why = await self.probe(endpoint)
                if not ok:
                    self.mark_down(endpoint, f"{reason}; {why}")
            finally:
                self._checking.discard(endpoint.url)

        asyncio.get_running_loop().create_task(check())

    async def check_all(self) -> None:
        results = await asyncio.gather(*(self.probe(endpoint) for endpoint in self.endpoints))
        for endpoint, (ok, why) in zip(self.endpoints, results):
            if ok:
                self.mark_up(endpoint)
            else:
                self.mark_down(endpoint, why)

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval_s)
            try:
                await self.check_all()
            finally:
                self.on_change()  # also wakes the scheduler to re-check its all-down deadline

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._health_loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass
            self._task = None
