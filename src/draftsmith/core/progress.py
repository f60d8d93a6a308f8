"""One progress reporter for every stage: a live bar on a terminal, plain periodic lines otherwise.

Always on stderr (stdout carries only a command's result). Counters are plain attributes, cheap to
bump per row; rich redraws the live display a few times a second, and without a terminal (CI, log
files) one line is printed every ``log_interval_s``. Rates are measured over a recent window; with a
token count the ETA is remaining items x mean tokens per item / recent tokens per second (completion
lengths vary a lot), else remaining items / recent items per second.
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

from draftsmith.core.units import format_duration


class Progress:
    """``with Progress("tokenize", total, unit="rows") as progress: progress.advance(n)``.

    ``done`` counts finished items, ``failed`` failed ones, ``tokens`` optional work units (output
    tokens, trained tokens) for a token rate; ``fields`` are extra ``name value`` parts of the line.
    """

    def __init__(self, label: str, total: int | None = None, *, unit: str = "items", enabled: bool = True,
                 console: Console | None = None, completed: int = 0, log_interval_s: float = 10.0,
                 window_s: float = 30.0, token_unit: str = "tok"):
        self.label = label
        self.total = total
        self.unit = unit
        self.token_unit = token_unit
        self.done = completed
        self.failed = 0
        self.tokens = 0
        self.fields: dict[str, Any] = {}
        self.console = console or Console(stderr=True)
        self.enabled = enabled
        self.interactive = enabled and self.console.is_terminal
        self.log_interval_s = log_interval_s
        self.window_s = window_s
        self.started = time.monotonic()
        self._base = (completed, 0)
        self._window: deque[tuple[float, int, int]] = deque()
        self._last_log = self.started
        self._live: Live | None = None

    # ---- counting ----

    def advance(self, count: int = 1, tokens: int | None = None, **fields: Any) -> None:
        self.done += count
        self.tokens += tokens or 0
        self.update(**fields)

    def update(self, completed: int | None = None, total: int | None = None, **fields: Any) -> None:
        if completed is not None:
            self.done = completed
        if total is not None:
            self.total = total
        self.fields.update(fields)
        self.tick()

    def __call__(self, completed: int, total: int | None = None) -> None:
        """As a ``progress(done, total)`` callback for stage functions."""
        self.update(completed, total)

    # ---- rates and the line ----

    def rates(self) -> tuple[float, float]:
        """(items/s, tokens/s) over the recent window."""
        now = time.monotonic()
        self._window.append((now, self.done, self.tokens))
        while len(self._window) > 2 and now - self._window[0][0] > self.window_s:
            self._window.popleft()
        first_time, first_done, first_tokens = self._window[0]
        if now - first_time < 0.5:
            elapsed = max(1e-9, now - self.started)
            return (self.done - self._base[0]) / elapsed, (self.tokens - self._base[1]) / elapsed
        elapsed = now - first_time
        return (self.done - first_done) / elapsed, (self.tokens - first_tokens) / elapsed

    def eta_s(self, item_rate: float, token_rate: float) -> float | None:
        if self.total is None:
            return None
        remaining = self.total - self.done - self.failed
        if remaining <= 0:
            return 0.0
        counted = self.done - self._base[0]
        if counted > 0 and self.tokens and token_rate > 0:
            return remaining * (self.tokens / counted) / token_rate
        return remaining / item_rate if item_rate > 0 else None

    def line(self) -> str:
        item_rate, token_rate = self.rates()
        if self.total:
            percent = 100.0 * (self.done + self.failed) / self.total
            parts = [f"{self.done:,}/{self.total:,} {self.unit} ({percent:.1f}%)"]
        else:
            parts = [f"{self.done:,} {self.unit}"]
        if self.tokens:
            parts.append(f"{token_rate:,.0f} {self.token_unit}/s")
        parts.append(f"{item_rate:,.1f} {self.unit}/s")
        if self.total is not None:
            parts.append(f"ETA {format_duration(self.eta_s(item_rate, token_rate), compact=True)}")
        if self.failed:
            parts.append(f"failed {self.failed:,}")
        parts += [f"{key} {value}" for key, value in self.fields.items()]
        return " | ".join(parts)

    def _render(self):
        line = Text(f"{self.label}: {self.line()}")
        if not self.total:
            return line
        return Group(ProgressBar(total=max(1, self.total), completed=self.done + self.failed, width=50), line)

    # ---- display ----

    def __enter__(self) -> Progress:
        if self.interactive:
            self._live = Live(get_renderable=self._render, console=self.console, refresh_per_second=4, transient=False)
            self._live.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._live is not None:
            if exc and exc[0] is not None:
                # A failed run leaves its one error line on stderr, not a half-drawn bar above it.
                self._live.transient = True
            self._live.__exit__(*exc)
            self._live = None

    def tick(self) -> None:
        """Print a plain line when there is no live display and ``log_interval_s`` has passed."""
        if not self.enabled or self.interactive:
            return
        now = time.monotonic()
        if now - self._last_log >= self.log_interval_s:
            self._last_log = now
            self.console.print(f"draftsmith {self.label}: {self.line()}", markup=False, highlight=False, soft_wrap=True)


LONG_RUN_S = 3600.0  # a CPU run projected past this gets a warning naming what cuts it


class LongRunWarning:
    """One warning, on stderr, when a run measured over its first units projects to hours.

    ``observe(done)`` after each unit (a step, a batch, a token). The clock starts at the first
    call (the first unit, which pays for warm-up, is not timed); once ``after_units`` more units or
    ``after_s`` seconds have passed, the remaining ``total - done`` units are projected at the
    measured rate and, past ``threshold_s``, ``log`` gets the warning with ``hints`` (the flags
    that cut the time). It then stays silent for the rest of the run.
    """

    def __init__(self, stage: str, total: int, unit: str, hints: list[str], *, log=None,
                 after_units: int = 3, after_s: float = 20.0, threshold_s: float = LONG_RUN_S,
                 enabled: bool = True, bound: str = "", clock=time.monotonic):
        self.stage, self.total, self.unit, self.hints = stage, total, unit, hints
        self.log = log or (lambda message: print(message, file=sys.stderr, flush=True))
        self.after_units, self.after_s, self.threshold_s = after_units, after_s, threshold_s
        self.bound = bound  # "up to " where `total` is an upper bound (eval: prompts stop early)
        self.clock = clock
        self.pending = enabled and total > 0
        self._start: tuple[float, int] | None = None
        self.projected_s: float | None = None

    def observe(self, done: int) -> None:
        if not self.pending:
            return
        now = self.clock()
        if self._start is None:
            self._start = (now, done)
            return
        elapsed, units = now - self._start[0], done - self._start[1]
        if units <= 0 or (units < self.after_units and elapsed < self.after_s):
            return
        self.pending = False
        per_unit = elapsed / units
        self.projected_s = per_unit * max(0, self.total - done) + (now - self._start[0])
        if self.projected_s >= self.threshold_s:
            self.log(long_run_message(self.stage, self.projected_s, per_unit, self.total, self.unit, self.hints, self.bound))


def long_run_message(stage: str, projected_s: float, per_unit_s: float, total: int, unit: str, hints: list[str],
                     bound: str = "") -> str:
    seconds = f"{per_unit_s:.3g} s" if per_unit_s >= 0.01 else f"{per_unit_s * 1000:.3g} ms"
    return (f"draftsmith {stage}: warning: this CPU run projects to {bound}{format_duration(projected_s)} "
            f"({seconds} per {unit} measured, {total:,} {unit}s); to cut it: " + "; ".join(hints))
