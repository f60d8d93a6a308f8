"""The `status` screen: a table of the job, then a row per shard (rich renderables, for print or Live)."""

from __future__ import annotations

import time

from rich.console import Group
from rich.table import Table
from rich.text import Text

from draftsmith.core.units import format_bytes, format_count, format_duration, format_tokens_per_s
from draftsmith.status.config import ALERT_STATES, StatusSummary

_STYLE = {"pending": "dim", "running": "green", "finished": "cyan", "stalled": "yellow", "dead": "red", "failing": "red"}


def clock(unix_time: float | None) -> str:
    """'Tue 14:00 UTC' (with the date when more than six days away)."""
    if unix_time is None:
        return "--"
    moment = time.localtime(unix_time)
    shape = "%a %H:%M %Z" if abs(unix_time - time.time()) < 6 * 86400 else "%a %d %b %H:%M %Z"
    return time.strftime(shape, moment)


def _rate(rows: float | None, tokens: float | None, unit: str) -> str:
    if rows is None and tokens is None:
        return "--"
    parts = [f"{rows:,.3g} {unit}/s" if rows is not None else None, format_tokens_per_s(tokens) if tokens else None]
    return ", ".join(part for part in parts if part)


def _age(seconds: float | None) -> str:
    return "--" if seconds is None else f"{format_duration(seconds)} ago"


def _progress(summary: StatusSummary) -> str:
    if summary.done is None:
        return "--"
    if not summary.total:
        return f"{summary.done:,}"
    share = summary.done / summary.total
    estimated = " (total estimated)" if summary.total_estimated else ""
    return f"{summary.done:,} / {summary.total:,} ({share:.1%}){estimated}"


def _settings_line(settings: dict) -> str:
    keys = ("model", "max_tokens", "temperature", "top_p", "seed", "shard_count", "concurrency")
    shown = [f"{key} {settings[key]}" for key in keys if settings.get(key) is not None]
    thinking = (settings.get("chat_template_kwargs") or {}).get("enable_thinking")
    if thinking is not None:
        shown.append(f"thinking {'on' if thinking else 'off'}")
    skip = (*keys, "chat_template_kwargs", "endpoints", "extra_body")
    shown += [f"{key} {value}" for key, value in settings.items() if key not in skip]
    return "  ".join(shown) or "--"


def _lengths_line(lengths: dict) -> str:
    if not lengths.get("rows"):
        return "--"
    parts = [f"mean {lengths['mean']:,.0f}  p50 {lengths['p50']:,.0f}  p90 {lengths['p90']:,.0f} tokens"]
    if lengths.get("length_share") is not None:
        cap = f" ({lengths['max_tokens']:,})" if lengths.get("max_tokens") else ""
        parts.append(f"stopped at max tokens{cap} {lengths['length_share']:.1%}")
    if lengths.get("thinking_share") is not None:
        parts.append(f"thinking {lengths['thinking_share']:.0%}")
    return "  ".join(parts)


def _replan_line(replan: dict) -> str:
    line = (f"planned {replan['planned_tokens']:,.0f} tokens, measured {replan['measured_tokens']:,.0f}: "
            f"{replan['change']:+.0%}")  # fmt: skip
    if "finishes_at" in replan:
        line += f", finishes {clock(replan['finishes_at'])} (the plan's mean: {clock(replan['planned_finishes_at'])})"
    return line


def _disk_line(disk: dict) -> str:
    line = f"free {format_bytes(disk['free_bytes'])}, written {format_bytes(disk['written_bytes'])}"
    if disk["needed_bytes"] is not None:
        line += f", the rest needs about {format_bytes(disk['needed_bytes'])}" + ("" if disk["enough"] else " -- NOT ENOUGH")
    return line


def _train_rows(table: Table, train: dict) -> None:
    loss = train.get("loss")
    tau = f"  train tau {train['train_tau']:.2f}" if train.get("train_tau") is not None else ""
    table.add_row("loss", "--" if loss is None else f"{loss:.4f}{tau}")
    last_eval, best = train.get("last_eval"), train.get("drafter_best")
    table.add_row("last eval", "--" if not last_eval else f"tau {last_eval['eval_tau']:.2f} at step {last_eval['step']:,}")
    table.add_row("drafter-best", "--" if not best else f"tau {best['eval_tau']:.2f} at step {best['step']:,}")
    checkpoint = train.get("checkpoint")
    table.add_row("checkpoint", "--" if not checkpoint else f"{checkpoint['name']}, written {_age(checkpoint['age_s'])}")
    if train.get("stopped"):
        table.add_row("stopped", train["stopped"])


def render(summary: StatusSummary):
    """The whole screen as one rich renderable."""
    title = Text.assemble(("draftsmith status: ", "bold"), (summary.stage, "bold"), "  ",
                          (summary.state.upper(), f"bold {_STYLE[summary.state]}"))  # fmt: skip
    table = Table(show_header=False, box=None, padding=(0, 2))
    table.add_row("directories", ", ".join(summary.directories))
    table.add_row("settings", _settings_line(summary.settings))
    if summary.settings.get("endpoints"):
        table.add_row("endpoints", ", ".join(summary.settings["endpoints"]))
    unit = "steps" if summary.stage in ("train", "plan data") else "rows"
    table.add_row("done", _progress(summary) + (f"  failed {summary.failed:,}" if summary.failed else ""))
    table.add_row("rate (window)", _rate(summary.rows_per_s, summary.output_tokens_per_s, unit))
    if summary.stage == "generate":
        table.add_row("rate (run)", _rate(summary.rows_per_s_since_start, summary.output_tokens_per_s_since_start, unit))
    if summary.state != "finished":
        eta = "--" if summary.eta_s is None else f"{format_duration(summary.eta_s)} (finishes {clock(summary.finishes_at)})"
        table.add_row("ETA", eta)
    if summary.stage == "generate":
        failures = ", ".join(f"{kind} {count:,}" for kind, count in sorted(summary.failures.items())) or "none"
        table.add_row("failures", failures)
        table.add_row("output lengths", _lengths_line(summary.lengths))
        if summary.replan:
            table.add_row("re-plan", _replan_line(summary.replan))
    if summary.train:
        _train_rows(table, summary.train)
    if summary.curve:
        method = f", fitted by {summary.curve['method']}" if summary.curve.get("method") else ""
        table.add_row("runs", f"{summary.curve['runs_measured']} of {summary.curve['runs_total']} measured{method}")
        if summary.curve.get("note"):
            table.add_row("stopped", summary.curve["note"])
    if len(summary.shards) == 1:  # several: a column of the shard table
        table.add_row("writer", summary.shards[0].writer)
    table.add_row("last write", _age(summary.last_write_age_s))
    if summary.disk:
        table.add_row("disk", _disk_line(summary.disk))
    parts = [title, table]
    if len(summary.shards) > 1:
        parts.append(_shard_table(summary))
    parts += [Text(f"! {alert}", style="yellow") for alert in summary.alerts]
    return Group(*parts)


def _shard_table(summary: StatusSummary) -> Table:
    table = Table(title=None, padding=(0, 1))
    for name in ("run" if summary.stage == "plan data" else "shard", "state", "done / total", "failed", "rows/s", "tok/s", "writer", "last write", "note"):
        table.add_column(name)
    for shard in summary.shards:
        total = f"{shard.total:,}" if shard.total is not None else "?"
        style = "red" if shard.state in ALERT_STATES else None
        table.add_row(shard.name, Text(shard.state, style=_STYLE[shard.state]), f"{shard.done or 0:,} / {total}",
                      f"{shard.failed:,}", "--" if shard.rows_per_s is None else f"{shard.rows_per_s:,.3g}",
                      "--" if not shard.output_tokens_per_s else format_count(shard.output_tokens_per_s, 3),
                      shard.writer, _age(shard.last_write_age_s), shard.note or "", style=style)  # fmt: skip
    return table
