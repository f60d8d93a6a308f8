"""`draftsmith tokenize`: conversations -> masked Parquet shards, then a gate on what was written."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from draftsmith.core.config import config_command

Gate = Callable[[Path, str, Any], bool]


def tokenize(config, audit: bool = True, *, gate: Gate | None = None) -> None:
    """Apply the target's chat template and build loss masks (1 = assistant tokens to learn)."""
    from rich.console import Console

    from draftsmith.tokenize.pipeline import TokenizeError, tokenize_dataset

    console = Console(stderr=True)
    try:
        summary = tokenize_dataset(config.inputs, config.tokenizer, config.out, config.options())
    except TokenizeError as error:
        if error.summary is not None:
            error.summary.render(console)
        raise
    except KeyboardInterrupt:  # Ctrl-C or SIGTERM: the workers are stopped, the lock released
        console.print(
            f"tokenize: stopped; the shards already in {config.out} are kept: run the same command "
            "with --resume to finish", markup=False, highlight=False,
        )
        raise
    summary.render(console)
    if audit and gate is not None and not gate(config.out, config.tokenizer, console):
        raise typer.Exit(1)


def register(app: typer.Typer, gate: Gate | None = None) -> None:
    """``gate(out_dir, tokenizer, console) -> passed``: the check of the written shards behind
    ``--audit``; the top-level CLI passes the audit stage's, since a stage never imports another."""
    from draftsmith.tokenize.config import TokenizeConfig

    extras = {}
    if gate is not None:
        extras["audit"] = (bool, typer.Option(True, "--audit/--no-audit", help="Audit the written shards afterwards."))
    config_command(app, "tokenize", TokenizeConfig, functools.partial(tokenize, gate=gate), extras=extras,
                   help=tokenize.__doc__)
