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


def test_a_long_run_warns_once_with_its_projection_and_cuts_and_a_short_one_says_nothing():
    from draftsmith.core.progress import LongRunWarning

    now = [0.0]
    said: list[str] = []
    # 2 s a step measured over 3 steps after the first (untimed warm-up): 10,000 steps are hours.
    long_run = LongRunWarning("train", 10_000, "step", ["--block-size (now 16)", "--offline FEATURES"],
                              log=said.append, clock=lambda: now[0])
    for step in range(1, 8):
        long_run.observe(step)
        now[0] += 2.0
    assert len(said) == 1
    assert said[0].startswith("draftsmith train: warning: this CPU run projects to 5.6 hours (2 s per step measured")
    assert said[0].endswith("to cut it: --block-size (now 16); --offline FEATURES")
    # The same rate over 100 steps is minutes: nothing said.
    quiet: list[str] = []
    short = LongRunWarning("train", 100, "step", ["--block-size"], log=quiet.append, clock=lambda: now[0])
    for step in range(1, 8):
        short.observe(step)
        now[0] += 2.0
    assert quiet == [] and short.projected_s is not None and short.projected_s < 3600
    # A slow unit is judged after after_s seconds, without waiting for after_units of them.
    slow: list[str] = []
    eval_run = LongRunWarning("eval", 1000, "token", ["--limit"], log=slow.append, clock=lambda: now[0], bound="up to ",
                              after_units=16)
    eval_run.observe(1)
    now[0] += 30.0
    eval_run.observe(2)
    assert len(slow) == 1 and "projects to up to 8.3 hours" in slow[0]
    off: list[str] = []
    disabled = LongRunWarning("train", 10_000, "step", [], log=off.append, clock=lambda: now[0], enabled=False)
    for step in range(1, 8):
        disabled.observe(step)
        now[0] += 2.0
    assert off == []
