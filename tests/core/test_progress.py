"""The one progress reporter: plain periodic lines without a terminal, a live bar on one."""

from __future__ import annotations

import io
import time

from rich.console import Console

from draftsmith.core.progress import Progress
from draftsmith.core.units import format_duration


def test_plain_lines_carry_counts_rate_and_eta():
    sink = io.StringIO()
    console = Console(file=sink, force_terminal=False, width=200)
    with Progress("tokenize", 100, unit="rows", console=console, log_interval_s=0.0) as progress:
        time.sleep(0.01)
        progress.advance(25, dropped="1")
    line = sink.getvalue().strip().splitlines()[-1]
    assert line.startswith("draftsmith tokenize: 25/100 rows (25.0%)")
    assert "rows/s" in line and "ETA " in line and "ETA --" not in line and "dropped 1" in line


def test_token_rate_and_a_callback_with_an_unknown_total():
    sink = io.StringIO()
    progress = Progress("eval", unit="prompts", console=Console(file=sink, force_terminal=False), log_interval_s=0.0)
    progress.advance(2, tokens=100)
    progress(3, None)  # the (done, total) callback the stage functions take
    assert progress.done == 3 and "tok/s" in progress.line() and "ETA" not in progress.line()


def test_disabled_prints_nothing_and_a_terminal_gets_a_live_bar():
    quiet = io.StringIO()
    with Progress("x", 10, console=Console(file=quiet, force_terminal=False), enabled=False, log_interval_s=0) as p:
        p.advance(5)
    assert quiet.getvalue() == ""
    tty = io.StringIO()
    with Progress("train", 10, unit="steps", console=Console(file=tty, force_terminal=True, width=120)) as p:
        p.advance(4, loss="1.2345")
    assert "train: 4/10 steps" in tty.getvalue() and "loss 1.2345" in tty.getvalue()


def test_durations():
    assert [format_duration(s, compact=True) for s in (59, 3_700, 90_000, None)] == ["0m59s", "1h01m", "1d01h", "--"]
