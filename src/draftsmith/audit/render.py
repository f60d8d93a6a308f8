"""Terminal rendering of an AuditReport with rich tables."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from draftsmith.audit.checks import INFO_CHECKS
from draftsmith.audit.format import distribution_stats, percent, span_label
from draftsmith.audit.format import shorten as _clip

# `AuditReport.render` imports this module; this module never imports the report's (it reads the
# report it is handed), so the two are no import circle.


def _explain(report) -> list[str]:
    """Plain-language reading of the failed gates that matter most."""
    lines = []
    failed = {gate.name for gate in report.failed_gates}
    span, mask_sum = report.dominant_span, report.dominant_mask_sum
    samples = max(report.samples, 1)
    if "dominant_span" in failed and span.count:
        lines.append(
            f"{percent(span.count / samples)} of samples train on the very same completion "
            f"{span_label(span)}"
            + (f" ({span.num_tokens} tokens)" if span.num_tokens is not None else "")
            + ": the drafter would learn one stock reply, not the target's behaviour. "
            "Regenerate these completions with the target model (thinking mode on if it thinks)."
        )
    elif "dominant_mask_sum" in failed:
        lines.append(
            f"{percent(mask_sum.count / samples)} of samples have exactly {mask_sum.value} trainable "
            f"{report.length_unit}: the completions are almost certainly boilerplate or truncated."
        )
    if "empty_thinking" in failed:
        lines.append(
            "Many answers have an empty thinking block: a thinking target's drafter needs its reasoning "
            "(for a target that does not think, pass --threshold empty_thinking=none)."
        )
    if {"scaffolding_masked", "prompt_masked"} & failed:
        lines.append("The loss mask trains on template or prompt tokens: fix the tokenize step's masking.")
    return lines


def render_report(report, console) -> None:
    """Print `report` (an `AuditReport`) as rich tables on `console`."""
    data = report.to_dict()
    unit = report.length_unit
    summary = Table(title=f"draftsmith audit: {report.input_kind}", show_header=False, title_justify="left")
    summary.add_column(style="bold")
    summary.add_column()
    summary.add_row("inputs", ", ".join(report.paths))
    summary.add_row("samples", f"{report.samples:,} ({report.bad_samples:,} unreadable)")
    stats = distribution_stats(report.trainable_counts)
    if stats:
        summary.add_row(
            f"trainable {unit}/sample",
            f"min {stats['min']}  p10 {stats['p10']}  p50 {stats['p50']}  p90 {stats['p90']}  "
            f"p99 {stats['p99']}  max {stats['max']}  mean {stats['mean']:.1f}  total {stats['total']:,}",
        )
    sequence = data["sequence"]
    if sequence:
        summary.add_row(
            "sequence tokens",
            f"min {sequence['min']}  p50 {sequence['p50']}  p90 {sequence['p90']}  max {sequence['max']}",
        )
    if report.settings.get("tokenizer"):
        summary.add_row("tokenizer", str(report.settings["tokenizer"]))
    if report.settings.get("max_context"):
        summary.add_row("context limit", f"{report.settings['max_context']:,} tokens")
    console.print(summary)

    dominant = Table(title="dominant values", title_justify="left")
    for column in ("what", "share", "samples", "value", "example ids"):
        dominant.add_column(column)
    for rank, entry in enumerate(report.dominant_mask_sum.top[:3]):
        share = entry["count"] / max(report.samples, 1)
        examples = ", ".join(report.dominant_mask_sum.example_ids[:3]) if rank == 0 else ""
        dominant.add_row(
            f"loss-mask sum = {entry['value']}", percent(share), f"{entry['count']:,}", f"{entry['value']} {unit}", examples
        )
    for entry in report.dominant_span.top[:3]:
        share = entry["count"] / max(report.samples, 1)
        label = "identical span" if report.input_kind == "tokenized" else "identical completion"
        if entry.get("num_tokens") is not None:
            label += f" ({entry['num_tokens']} tok)"
        value = entry.get("text")
        if value is None and entry.get("token_ids"):
            value = "ids " + " ".join(map(str, entry["token_ids"][:16]))
        dominant.add_row(label, percent(share), f"{entry['count']:,}", _clip(value, 60), ", ".join(entry["example_ids"][:3]))
    console.print(dominant)

    gates = Table(title="checks", title_justify="left")
    for column in ("gate", "share", "samples", "limit", "status", "examples / note"):
        gates.add_column(column)
    for gate in report.gates:
        check = report.checks.get(gate.name)
        if check is None and gate.message.endswith("not applicable"):
            continue  # e.g. loss-mask checks for conversations
        count = check.count if check else None
        if gate.name == "bad_samples":
            count = report.bad_samples
        elif gate.name == "dominant_mask_sum":
            count = report.dominant_mask_sum.count
        elif gate.name == "dominant_span":
            count = report.dominant_span.count
        if gate.skipped:
            status = Text("off" if gate.limit is None else "n/a", style="dim")
        else:
            status = Text("ok", style="green") if gate.passed else Text("FAIL", style="bold red")
        if gate.name == "min_samples":
            share, limit = f"{gate.value:,}", "" if gate.limit is None else f">= {gate.limit:,}"
            count = None
        else:
            share = "" if gate.value is None else percent(gate.value)
            limit = "" if gate.limit is None else percent(gate.limit)
        note = ""
        if check is not None:
            note = ", ".join(check.example_ids[:3]) if check.count else check.note
        gates.add_row(gate.name, share, "" if count is None else f"{count:,}", limit, status, note)
    for name in INFO_CHECKS:
        check = report.checks.get(name)
        if check is not None and check.checked and check.count:
            share = check.count / max(report.samples, 1)
            gates.add_row(name, percent(share), f"{check.count:,}", "", Text("info", style="dim"), ", ".join(check.example_ids[:3]))
    console.print(gates)

    if report.errors:
        console.print(Text(f"{report.errors_total:,} unreadable-sample errors (first {len(report.errors)}):", style="yellow"))
        for line in report.errors[:10]:
            console.print(Text("  " + line, style="yellow"))
    for line in _explain(report):
        console.print(Text(line, style="bold"), soft_wrap=True)
    # One unwrapped line, last, so logs and pipelines can grep it.
    console.print(Text(report.verdict, style="bold green" if report.passed else "bold red"), soft_wrap=True)

