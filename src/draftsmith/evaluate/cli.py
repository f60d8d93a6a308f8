"""`draftsmith eval`: speculative decoding with a drafter vs plain decoding of its target, in this
process or on a live serving engine (`--endpoint`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command("eval")
    def eval_command(
        prompts: Path = typer.Option(..., help="Prompts: JSONL/JSON/Parquet rows with messages, conversations or prompt."),
        target: Path = typer.Option(None, help="Target model directory (Hugging Face format, with tokenizer)."),
        drafter: Path = typer.Option(None, help="Drafter checkpoint directory (config.json + model.safetensors)."),
        endpoint: str = typer.Option(None, help="Measure a live engine serving target + drafter at this URL (vLLM or SGLang)."),
        baseline_endpoint: str = typer.Option(None, help="With --endpoint: the same target served without speculation."),
        model: str = typer.Option(None, help="With --endpoint: served model name (default: the first of /v1/models)."),
        max_new_tokens: int = typer.Option(256, min=1, help="Tokens to generate per prompt."),
        limit: int = typer.Option(None, min=1, help="Evaluate only the first N prompts."),
        block_size: int = typer.Option(None, min=2, help="Draft block size (default: the drafter's)."),
        thinking: bool = typer.Option(None, "--thinking/--no-thinking", help="Pass enable_thinking to the chat template."),
        dtype: str = typer.Option("float32", help="float32 or bfloat16 for target and drafter."),
        temperature: float = typer.Option(0.0, min=0.0, help="0 = greedy (checks token identity); >0 = speculative sampling."),
        seed: int = typer.Option(0, help="Sampling seed (temperature > 0)."),
        out: Path = typer.Option(None, help="Also write the JSON report to this file."),
        as_json: bool = typer.Option(False, "--json", help="Print the JSON report instead of tables."),
        threads: int = typer.Option(None, min=1, help="torch CPU threads (1 is fastest for tiny models on busy machines)."),
    ) -> None:
        """Run real speculative decoding; report tau, per-position acceptance, tokens/s and losslessness."""
        from pydantic import ValidationError
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        from draftsmith.core.errors import InputError
        from draftsmith.evaluate.config import EvalConfig
        from draftsmith.evaluate.speculative import LosslessnessError, _mismatch_message

        try:
            config = EvalConfig(
                prompts=prompts, target=target, drafter=drafter, endpoint=endpoint,
                baseline_endpoint=baseline_endpoint, model=model, max_new_tokens=max_new_tokens, limit=limit,
                block_size=block_size, thinking=thinking, dtype=dtype, temperature=temperature, seed=seed,
                threads=threads,
            )
        except ValidationError as error:
            raise InputError("; ".join(e["msg"].removeprefix("Value error, ") for e in error.errors())) from None
        err = Console(stderr=True)
        with Progress(
            TextColumn("eval"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=err, transient=True
        ) as bar:
            task = bar.add_task("eval", total=None)
            report = run_eval(config, progress=lambda done, total: bar.update(task, completed=done, total=total))
        if out is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + ".tmp")
            tmp.write_text(report.to_json() + "\n")
            tmp.replace(out)
        if as_json:
            typer.echo(json.dumps(report.to_dict(), indent=2))
        else:
            report.render(Console())
            typer.echo(report.verdict)
        if config.endpoint is None and report.lossless is False:
            raise LosslessnessError(_mismatch_message(report))
        if config.endpoint is not None and report.identical_to_baseline is False:
            raise LosslessnessError(
                f"greedy output on {report.endpoint} differs from {report.baseline_endpoint} for "
                f"{len(report.mismatched_prompts)} of {report.num_prompts} prompts: {', '.join(report.mismatched_prompts[:5])}"
            )


def run_eval(config, progress=None):
    """`EvalConfig` -> `EvalReport` (in-process) or `EndpointReport` (`config.endpoint`)."""
    if config.endpoint is not None:
        from draftsmith.evaluate.endpoint import evaluate_endpoint

        return evaluate_endpoint(
            config.endpoint, config.prompts, baseline_endpoint=config.baseline_endpoint, model=config.model,
            max_new_tokens=config.max_new_tokens, temperature=config.temperature,
            seed=config.seed if config.temperature > 0 else None, limit=config.limit,
            enable_thinking=config.thinking, progress=progress,
        )
    import torch

    from draftsmith.evaluate.speculative import evaluate_drafter

    if config.threads is not None:
        torch.set_num_threads(config.threads)
    return evaluate_drafter(
        config.target, config.drafter, config.prompts, max_new_tokens=config.max_new_tokens,
        block_size=config.block_size, limit=config.limit, enable_thinking=config.thinking,
        dtype={"float32": torch.float32, "bfloat16": torch.bfloat16}[config.dtype], strict=False,
        progress=progress, temperature=config.temperature, seed=config.seed,
    )
