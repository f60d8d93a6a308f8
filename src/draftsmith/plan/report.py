"""Rendering a `Plan` as rich tables for people (`--json` prints `Plan.to_dict()` for machines)."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from draftsmith.plan.capacity import Plan
from draftsmith.plan.engine import EnginePlan
from draftsmith.plan.training import TrainPlan
from draftsmith.plan.distribution import LengthStats
from draftsmith.core.units import format_bytes, format_count, format_duration, format_tokens_per_s


def render_plan(plan: Plan, console: Console | None = None) -> None:
    console = console or Console()
    console.print(_summary_table(plan))
    if plan.rate_checks:
        console.print(_rate_table(plan))
    for title, stats in (("Output length", plan.output_distribution), ("Prompt length", plan.prompt_distribution)):
        if stats is not None:
            console.print(_distribution_table(title, stats))
            for note in _distribution_notes(stats, tail=title.startswith("Output")):
                console.print(f"  {note}")
    console.print(_sensitivity_table(plan))
    if plan.gpu_scaling:
        console.print(_gpu_table(plan))
    if plan.deadline is not None:
        console.print(_deadline_line(plan))
    if plan.storage is not None:
        console.print(_storage_table(plan))
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}")


def _summary_table(plan: Plan) -> Table:
    table = Table(title="Regeneration plan", show_header=False, title_justify="left")
    table.add_column("", style="bold")
    table.add_column("")
    throughput = plan.throughput
    table.add_row("samples", f"{plan.samples:,}")
    length = f"{plan.output_mean:,.0f} tokens"
    if plan.max_tokens:
        length += f" (max_tokens {plan.max_tokens:,})"
    table.add_row("average output", length)
    table.add_row("total output tokens", f"{plan.total_output_tokens:,} ({format_count(plan.total_output_tokens)})")
    if plan.total_prompt_tokens is not None:
        table.add_row("total prompt tokens", f"{plan.total_prompt_tokens:,} ({format_count(plan.total_prompt_tokens)})")
    label = {"bench": "the bench knee", "per-gpu": "--per-gpu", "throughput": "--throughput"}.get(
        throughput.source, f"--claimed-rate ({throughput.source})"
    )
    rate = f"{format_tokens_per_s(throughput.tokens_per_s)} from {label}"
    if throughput.per_gpu_tokens_per_s is not None and throughput.gpus:
        rate += (
            f"  [{format_tokens_per_s(throughput.per_gpu_tokens_per_s)} per GPU x {throughput.gpus} GPUs"
            + (f" x {throughput.efficiency:g} efficiency" if throughput.gpus > 1 and throughput.efficiency < 1 else "")
            + "]"
        )
    table.add_row("throughput", rate)
    table.add_row(
        "rate per hour / day",
        f"{format_count(throughput.tokens_per_hour)}/hour, {format_count(throughput.tokens_per_day)}/day",
    )
    wall = plan.wall_time
    table.add_row(
        "wall time", f"[bold]{wall.days:.1f} days[/bold] ({wall.hours:,.1f} hours, {wall.seconds:,.0f} s)"
    )
    ceiling = plan.ceiling
    if ceiling is not None:
        line = (f"{ceiling['ceiling_tokens_per_s_per_gpu']:,.0f} tok/s per GPU on {ceiling['gpus']} x {ceiling['gpu']} at batch "
                f"{ceiling['batch']} ({ceiling['weights']}, engine {ceiling['engine']}): {ceiling['days_at_ceiling']:.1f} days "
                f"at the ceiling, {ceiling['days_at_efficiency']:.1f} at {ceiling['efficiency']:g} of it"
                + (f" (prefill {ceiling['prefill_share']:.0%} of the step)" if ceiling.get("prefill_share") else ""))
        if ceiling["measured_share"] is not None:
            line += f"; [bold]the measured rate is {ceiling['measured_share']:.0%} of the ceiling[/bold]"
        table.add_row("decode ceiling", line)
    return table


def _rate_table(plan: Plan) -> Table:
    table = Table(title="Rate cross-check", title_justify="left")
    table.add_column("rate")
    table.add_column("tok/s", justify="right")
    table.add_column("vs plan", justify="right")
    table.add_column("verdict")
    for check in plan.rate_checks:
        verdict = "[green]agrees[/green]" if check.agrees else f"[red]disagrees[/red]: {check.message}"
        table.add_row(f"{check.other}: {check.other_text}", f"{check.other_tokens_per_s:,.1f}", f"{check.ratio:#.3g}x", verdict)
    return table


def _distribution_table(title: str, stats: LengthStats) -> Table:
    table = Table(title=f"{title} ({stats.count:,} observed)", title_justify="left")
    for column in ("mean", "p50", "p90", "p99", "max"):
        table.add_column(column, justify="right")
    table.add_row(*(f"{value:,.0f}" for value in (stats.mean, stats.p50, stats.p90, stats.p99, stats.max)))
    return table


def _distribution_notes(stats: LengthStats, tail: bool) -> list[str]:
    notes = [f"from {stats.source}"] if stats.source else []
    if stats.max_tokens is not None and stats.share_at_cap is not None:
        notes.append(
            f"{stats.share_at_cap:.1%} of samples hit max_tokens={stats.max_tokens:,}; the cap removes "
            f"{stats.tokens_cut_share:.1%} of tokens (mean {stats.mean_before_cap:,.0f} before the cap)"
        )
    if tail:
        notes.append(stats.describe_tail())
        suggested, why = stats.suggest_max_tokens()
        notes.append(f"suggested --max-tokens {suggested:,}: {why}")
    return notes


def _sensitivity_table(plan: Plan) -> Table:
    sensitivity = plan.sensitivity
    table = Table(title="Days to finish (rows tok/s, cols avg output)", title_justify="left")
    table.add_column("tok/s", justify="right")
    for factor, mean in zip(sensitivity.length_factors, sensitivity.output_means):
        header = f"{mean:,.0f}"
        table.add_column(f"[bold]{header}[/bold]" if factor == 1.0 else header, justify="right")
    for factor, rate, row in zip(sensitivity.throughput_factors, sensitivity.tokens_per_s, sensitivity.days):
        label = f"{rate:,.0f}"
        cells = []
        for length_factor, days in zip(sensitivity.length_factors, row):
            text = f"{days:.1f}"
            cells.append(f"[bold]{text}[/bold]" if factor == 1.0 and length_factor == 1.0 else text)
        table.add_row(f"[bold]{label}[/bold]" if factor == 1.0 else label, *cells)
    return table


def _gpu_table(plan: Plan) -> Table:
    efficiency = plan.throughput.efficiency
    table = Table(title=f"GPU scaling (efficiency {efficiency:g} beyond one GPU)", title_justify="left")
    table.add_column("GPUs", justify="right")
    table.add_column("tok/s", justify="right")
    table.add_column("days", justify="right")
    table.add_column("hours", justify="right")
    if plan.deadline is not None:
        table.add_column(f"within {plan.deadline.deadline}")
    for row in plan.gpu_scaling:
        cells = [str(row.gpus), f"{row.tokens_per_s:,.0f}", f"{row.days:.1f}", f"{row.hours:,.1f}"]
        if plan.deadline is not None:
            cells.append("[green]yes[/green]" if row.meets_deadline else "[red]no[/red]")
        style = "bold" if row.gpus == plan.throughput.gpus else None
        table.add_row(*cells, style=style)
    return table


def _deadline_line(plan: Plan) -> str:
    deadline = plan.deadline
    assert deadline is not None
    status = (
        f"[green]meets[/green] the {deadline.deadline} deadline with {format_duration(deadline.slack_s)} to spare"
        if deadline.meets_deadline
        else f"[red]misses[/red] the {deadline.deadline} deadline by {format_duration(-deadline.slack_s)}"
    )
    line = f"Deadline: the plan {status}; finishing in {deadline.deadline} needs {format_tokens_per_s(deadline.required_tokens_per_s)}"
    if deadline.gpus_needed is not None and deadline.wall_time_with_gpus_needed is not None:
        line += (
            f" = [bold]{deadline.gpus_needed} GPUs[/bold] at this per-GPU rate and efficiency "
            f"({deadline.wall_time_with_gpus_needed.human})"
        )
    return line + "."


def _storage_table(plan: Plan) -> Table:
    storage = plan.storage
    assert storage is not None
    table = Table(title="Hidden states for offline drafter training", show_header=False, title_justify="left")
    table.add_column("", style="bold")
    table.add_column("")
    table.add_row("per token", f"{storage.num_captured_layers} layers x {storage.hidden_size} x {storage.dtype_bytes} B = "
                  f"{storage.bytes_per_token:,} B")
    table.add_row("per sample", format_bytes(storage.bytes_per_sample))
    table.add_row("total", f"{format_bytes(storage.total_bytes)} ({storage.total_bytes:,} bytes)")
    verdict_style = "green" if storage.recommendation == "offline" else "yellow"
    table.add_row("recommendation", f"[{verdict_style}]{storage.recommendation}[/{verdict_style}]: {storage.reason}")
    return table


def render_train_plan(plan: TrainPlan, console: Console | None = None) -> None:
    console = console or Console()
    inputs = plan.inputs
    table = Table(title=f"Training plan ({plan.mode})", show_header=False, title_justify="left")
    table.add_column("", style="bold")
    table.add_column("")
    table.add_row("target", f"{inputs['model_config_path']}: {plan.target_params:,} params ({format_count(plan.target_params)}), "
                  f"{plan.target_layer_params:,} per layer")
    table.add_row("drafter", f"{inputs['draft_layers']} layers, {inputs['num_features']} captured target layers: "
                  f"{plan.drafter_params:,} trainable params ({format_count(plan.drafter_params)})")
    table.add_row("data", f"{inputs['samples']:,} samples x {inputs['mean_length']:,.0f} tokens x {inputs['epochs']} epochs = "
                  f"{plan.total_sequences:,} sequences, {format_count(plan.total_tokens)} tokens")
    table.add_row("blocks", f"{inputs['num_anchors']} anchors x block {inputs['block_size']}, micro-batch {inputs['batch_size']}, "
                  f"max length {inputs['max_length']:,}")
    table.add_row("GPUs", f"{inputs['gpus']} x {inputs['gpu']} ({plan.peak_flops / 1e12:,.0f} TFLOP/s bf16 peak, "
                  f"{plan.gpu_memory / 1e9:,.0f} GB), MFU {inputs['mfu']:g}, {inputs['dtype']}")
    headline = plan.headline
    how = "measured rate (train-bench)" if headline.source == "train-bench" else f"{headline.attention} attention estimate"
    table.add_row("wall time", f"[bold]{headline.wall_time.days:.1f} days[/bold] ({headline.wall_time.hours:,.1f} hours) from the {how}")
    console.print(table)

    times = Table(title="Wall time", title_justify="left")
    for column in ("attention", "source", "target fwd TFLOP/seq", "drafter TFLOP/seq", "tok/s per GPU", "days"):
        times.add_column(column, justify="left" if column in ("attention", "source") else "right")
    for row in plan.times:
        flops = row.flops_per_sequence
        target = f"{flops.target_forward / 1e12:,.1f}" if flops else "-"
        drafter = f"{(flops.total - flops.target_forward) / 1e12:,.1f}" if flops else "-"
        times.add_row(row.attention, row.source, target, drafter, f"{row.tokens_per_s_per_gpu:,.0f}", f"{row.wall_time.days:.1f}",
                      style="bold" if row is plan.headline or row == plan.headline else None)
    console.print(times)

    memory = Table(title=f"Memory per GPU (GB of {plan.gpu_memory / 1e9:,.0f})", title_justify="left")
    memory.add_column("component", no_wrap=True)
    columns = [*plan.memory, *plan.memory_fsdp]
    for item in columns:
        memory.add_column(f"{item.attention}\nDDP" if item.sharding == "ddp" else f"{item.attention}\nFSDP x{item.gpus}",
                          justify="right")
    for label, key in (("target weights", "target_weights"), ("target activations", "target_activations"),
                       ("features", "features"), ("drafter + grads + AdamW (fp32)", "drafter_states"),
                       ("drafter activations", "drafter_activations"), ("logits (one loss chunk)", "logits"),
                       ("attention workspace", "attention_workspace"), ("FSDP gathered layers + LM head", "fsdp_gathered"),
                       ("total", "total")):  # fmt: skip
        memory.add_row(label, *(f"{getattr(item, key) / 1e9:,.1f}" for item in columns), style="bold" if key == "total" else None)
    memory.add_row("fits", *("-" if item.fits is None else ("[green]yes[/green]" if item.fits else "[red]no[/red]") for item in columns))
    console.print(memory)
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}")


def _days_text(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"


def _share_text(share: float) -> str:
    return "<0.1%" if 0 < share < 0.001 else f"{share:.1%}"


def render_engine_plan(plan: EnginePlan, console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title="Decode ceiling (plan engine)", show_header=False, title_justify="left")
    table.add_column("", style="bold")
    table.add_column("")
    table.add_row("model", f"{plan.model}" + (f" ({format_count(plan.params)} params)" if plan.params else ""))
    spec = "no speculation" if plan.speculative == "none" else (
        f"{plan.speculative}, {plan.draft_tokens} draft tokens, {plan.acceptance:g} accepted per step")
    table.add_row("deployment", f"{plan.gpus} x {plan.gpu}, TP {plan.tp}, engine {plan.engine}; weights {plan.weights}, "
                  f"KV {plan.kv_cache}, state {plan.state_dtype}; {spec}")
    table.add_row("lengths", f"prompt {plan.prompt_mean:,.0f} + output {plan.output_mean:,.0f} tokens: mean live context "
                  f"{plan.mean_context:,.0f}")
    table.add_row("weights_bytes_per_step", f"{plan.weights_bytes_per_step / 1e9:,.2f} GB per GPU")
    table.add_row("kv_bytes_per_token", f"{plan.kv_bytes_per_token:,.0f} B")
    table.add_row("state_bytes_per_sequence", f"{plan.state_bytes_per_sequence / 1e6:,.1f} MB x {plan.state_copies} "
                  f"cop{'y' if plan.state_copies == 1 else 'ies'}")
    table.add_row("max_batch", f"{plan.max_batch:,}")
    table.add_row("batch", f"{plan.batch:,} (requested {plan.requested_concurrency})")
    table.add_row("step_time_s", f"{plan.step_time_s * 1e3:,.1f} ms (bandwidth {plan.step_time_bandwidth_s * 1e3:,.1f} ms, "
                  f"compute {plan.step_time_compute_s * 1e3:,.1f} ms"
                  + (f", all-reduce {plan.step_time_allreduce_s * 1e3:,.1f} ms" if plan.step_time_allreduce_s else "") + ")")
    table.add_row("bound", plan.bound)
    if plan.prefill_tokens_per_step:
        table.add_row("prefill", f"{plan.prefill_tokens_per_step:,.1f} prompt tokens per step (chunked with decode): "
                      f"{_share_text(plan.prefill_share)} of the step time")
    table.add_row("ceiling", f"[bold]{plan.ceiling_tokens_per_s_per_gpu:,.0f} tok/s per GPU[/bold] "
                  f"({plan.ceiling_tokens_per_s_per_gpu * plan.efficiency:,.0f} at efficiency {plan.efficiency:g})")
    if plan.measured_share is not None:
        table.add_row("measured", f"{plan.measured_tokens_per_s_per_gpu:,.0f} tok/s per GPU from {plan.measured_source}: "
                      f"[bold]the measured rate is {plan.measured_share:.0%} of the ceiling[/bold]")
    if plan.samples is not None:
        days = f"{_days_text(plan.days_at_ceiling)} at the ceiling, {_days_text(plan.days_at_efficiency)} at efficiency {plan.efficiency:g}"
        if plan.days_at_measured is not None:
            days += f", {_days_text(plan.days_at_measured)} at the measured rate"
        table.add_row("days", f"{plan.samples:,} samples: {days}")
    console.print(table)
    knobs = Table(title="Knobs, ranked by ceiling (days at the efficiency)", title_justify="left")
    for column in ("knob", "tok/s/GPU", "x", "days", "prefill", "note"):
        knobs.add_column(column, justify="right" if column in ("tok/s/GPU", "x", "days", "prefill") else "left")
    for knob in plan.knobs:
        knobs.add_row(knob.knob, f"{knob.ceiling_tokens_per_s_per_gpu:,.0f}", f"{knob.gain:.2f}", _days_text(knob.days),
                      f"{knob.prefill_share:.0%}" if knob.batch else "-", knob.note)
    console.print(knobs)
    for warning in plan.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}")
