"""`draftsmith eval`: speculative decoding with a drafter vs plain decoding of its target, in this
process or on a live serving engine (`--endpoint`)."""

from __future__ import annotations

import typer

from draftsmith.core.config import config_command
from draftsmith.core.io import dumps_json
from draftsmith.evaluate.config import EvalConfig


def run_eval(config: EvalConfig, progress=None, on_tokens=None):
    """`EvalConfig` -> `EvalReport` (in-process) or `EndpointReport` (`config.endpoint`)."""
    if config.endpoint is not None:
        from draftsmith.evaluate.endpoint import evaluate_endpoint

        return evaluate_endpoint(
            config.endpoint, config.prompts, baseline_endpoint=config.baseline_endpoint, model=config.model,
            max_new_tokens=config.max_new_tokens, temperature=config.temperature,
            seed=config.seed if config.temperature > 0 else None, limit=config.limit,
            enable_thinking=config.thinking, progress=progress, split=config.split,
        )
    from draftsmith.core.config import torch_dtype
    from draftsmith.core.limits import choose_threads
    from draftsmith.evaluate.speculative import evaluate_drafter

    device = resolve_device(config.device)
    # torch's own default, every core, ran about 10x slower on a loaded 2-core machine: on the CPU one
    # thread per CPU the load leaves idle, and why.
    _, threads_line = choose_threads(config.threads, on_cpu=device == "cpu")
    if threads_line is not None:  # said once decoding starts: a bad input before it stays one line
        on_tokens = _say_first(f"draftsmith eval: {threads_line}", on_tokens)
    return evaluate_drafter(
        config.target, config.drafter, config.prompts, max_new_tokens=config.max_new_tokens,
        block_size=config.block_size, limit=config.limit, enable_thinking=config.thinking,
        dtype=torch_dtype(config.dtype), strict=False, progress=progress,
        temperature=config.temperature, seed=config.seed, split=config.split,
        device=device, tie_tolerance=config.tie_tolerance,
        baselines=config.baseline, ngram_max=config.ngram_max, ngram_min=config.ngram_min,
        mask_token_id=config.mask_token_id, on_tokens=on_tokens,
    )


def _say_first(line: str, on_tokens=None):
    """`on_tokens` that prints `line` to stderr on its first call."""
    import sys

    said = False

    def announce(count: int) -> None:
        nonlocal said
        if not said:
            said = True
            print(line, file=sys.stderr, flush=True)
        if on_tokens is not None:
            on_tokens(count)

    return announce


def resolve_device(name: str) -> str:
    """`auto` -> cuda when torch sees a GPU, else cpu; a device torch cannot use here is one line."""
    import torch

    from draftsmith.core.errors import InputError

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    kind, _, index = name.partition(":")
    backend = {"cuda": torch.cuda, "xpu": getattr(torch, "xpu", None), "mps": getattr(torch.backends, "mps", None)}.get(kind)
    if backend is not None and not backend.is_available():
        raise InputError(f"--device {name}: this torch ({torch.__version__}) sees no {kind} device")
    if index and kind in ("cuda", "xpu") and int(index) >= backend.device_count():
        raise InputError(f"--device {name}: only {backend.device_count()} {kind} devices here")
    return name


def evaluate(config: EvalConfig, as_json: bool = False) -> None:
    """Run real speculative decoding (or measure a live engine); report tau, per-position acceptance,
    tokens/s and losslessness."""
    from rich.console import Console

    from draftsmith.core.io import write_atomic
    from draftsmith.core.lazy import require_optional
    from draftsmith.core.progress import Progress
    from draftsmith.evaluate.speculative import LosslessnessError, _mismatch_message

    if config.plot is not None:
        require_optional("matplotlib", "--plot", "plot")
    err = Console(stderr=True)
    with Progress("eval", unit="prompts", console=err) as bar:
        report = run_eval(config, progress=bar, on_tokens=lambda count: bar.advance(0, tokens=count))
    if config.out is not None:
        config.out.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(config.out, report.to_json() + "\n")
    if config.plot is not None:
        from draftsmith.evaluate.plot import plot_eval_report

        plot_eval_report(report, config.plot)
        err.print(f"plot written to {config.plot}")
    if as_json:
        typer.echo(dumps_json(report.to_dict()))
    else:
        report.render(Console())
        typer.echo(report.verdict)
    if config.endpoint is None and report.not_lossless:
        raise LosslessnessError(_mismatch_message(report))
    if config.endpoint is not None and report.identical_to_baseline is False:
        raise LosslessnessError(
            f"greedy output on {report.endpoint} differs from {report.baseline_endpoint} for "
            f"{len(report.mismatched_prompts)} of {report.num_prompts} prompts: {', '.join(report.mismatched_prompts[:5])}"
        )


def register(app: typer.Typer) -> None:
    config_command(app, "eval", EvalConfig, evaluate, extras={
        "as_json": (bool, typer.Option(False, "--json", help="Print the JSON report instead of tables.")),
    })
