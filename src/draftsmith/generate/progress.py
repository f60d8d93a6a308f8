"""Live progress for a generation run: samples done, output tok/s, ETA, failures, guard shares.

Counters are plain attributes updated per row (cheap at thousands of rows/s); the display is
refreshed by rich a few times a second. Without a terminal (CI, logs) one line is logged every
``log_interval_s`` instead.

The ETA uses the measured completion-length distribution: remaining samples x mean completion
tokens so far / recent output tokens per second (falling back to the sample rate before any
token counts are known).
"""

from __future__ import annotations

import sys
import time
from collections import deque
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.text import Text


def _format_duration(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds == float("inf"):
        return "--"
    seconds = int(seconds)
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    if days:
        return f"{days}d{hours:02d}h"
    if hours:
        return f"{hours}h{minutes:02d}m"
    return f"{minutes}m{secs:02d}s"


class RunProgress:
    def __init__(self, total: int, enabled: bool = True, console: Console | None = None,
                 log_interval_s: float = 10.0, window_s: float = 30.0):
        self.total = total
        self.done = 0
        self.failed = 0
        self.retries = 0
        self.output_tokens = 0
        self.started = time.monotonic()
        self.console = console or Console(stderr=True)
        self.enabled = enabled
        self.interactive = enabled and self.console.is_terminal
        self.log_interval_s = log_interval_s
        self.window_s = window_s
        self._samples: deque[tuple[float, int, int]] = deque()
        self._last_log = self.started
        self._live: Live | None = None
        self.extra: dict[str, Any] = {}

    def add_row(self, completion_tokens: int | None) -> None:
        self.done += 1
        self.output_tokens += completion_tokens or 0

    def rates(self) -> tuple[float, float]:
        """(samples/s, output tokens/s) over the recent window."""
        now = time.monotonic()
        self._samples.append((now, self.done, self.output_tokens))
        while len(self._samples) > 2 and now - self._samples[0][0] > self.window_s:
            self._samples.popleft()
        first = self._samples[0]
        elapsed = now - first[0]
        if elapsed < 0.5:
            elapsed = max(1e-9, now - self.started)
            return self.done / elapsed, self.output_tokens / elapsed
        return (self.done - first[1]) / elapsed, (self.output_tokens - first[2]) / elapsed

    def eta_s(self, sample_rate: float, token_rate: float) -> float | None:
        remaining = self.total - self.done - self.failed
        if remaining <= 0:
            return 0.0
        if self.done and self.output_tokens and token_rate > 0:
            return remaining * (self.output_tokens / self.done) / token_rate
        return remaining / sample_rate if sample_rate > 0 else None

    def line(self) -> str:
        sample_rate, token_rate = self.rates()
        percent = 100.0 * (self.done + self.failed) / self.total if self.total else 100.0
        parts = [
            f"{self.done:,}/{self.total:,} done ({percent:.1f}%)",
            f"{token_rate:,.0f} out tok/s",
            f"{sample_rate:,.1f} samples/s",
            f"ETA {_format_duration(self.eta_s(sample_rate, token_rate))}",
            f"failed {self.failed}",
            f"retries {self.retries}",
        ]
        parts += [f"{key} {value}" for key, value in self.extra.items()]
        return " | ".join(parts)

    def _render(self):
        bar = ProgressBar(total=max(1, self.total), completed=self.done + self.failed, width=50)
        return Group(bar, Text(self.line()))

    def __enter__(self) -> RunProgress:
        if self.interactive:
            self._live = Live(get_renderable=self._render, console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            self._live.__exit__(*exc)
            self._live = None

    def tick(self) -> None:
        """Called periodically by the pipeline; logs a line when there is no live display."""
        if not self.enabled or self.interactive:
            return
        now = time.monotonic()
        if now - self._last_log >= self.log_interval_s:
            self._last_log = now
            print(f"draftsmith generate: {self.line()}", file=sys.stderr, flush=True)
