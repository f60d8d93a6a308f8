"""The `draftsmith` command: a thin layer over the Python API, one sub-command per stage.

Each stage module exposes `register(app)` that adds its command(s), built from the stage's config
model by `draftsmith.core.config.config_command`; this file only wires them and turns
`DraftsmithError` (and a pydantic `ValidationError` a stage raised) into one line with exit code 2.
"""

from __future__ import annotations

import sys

import typer
from pydantic import ValidationError

from draftsmith import __version__
from draftsmith.core.config import describe_validation_error
from draftsmith.core.errors import DraftsmithError
from draftsmith.core.io import DiskFullError
from draftsmith.core.redact import redact

app = typer.Typer(
    name="draftsmith",
    help="Plan, audit, regenerate, tokenize and train DFlash speculative-decoding drafters.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


@app.command("version")
def version_command() -> None:
    """Print the draftsmith version."""
    typer.echo(__version__)


# Each stage's own module adds its commands; the order here is the order of `--help`.
import importlib  # noqa: E402

STAGE_MODULES = (
    "plan",
    "audit",
    "bench",
    "generate",
    "tokenize",
    "train",
    "evaluate",
    "export",
    "status",
    "check",
    "serve",
    "demo",
    "tiny",
    "models",
)



def audit_tokenized_output(output_dir, tokenizer: str, console) -> bool:
    """tokenize's post-write gate: the audit stage on the shards just written (the tokenizer enables
    the span checks). Composed here because a stage never imports another stage."""
    from draftsmith.audit import audit_tokenized

    report = audit_tokenized(output_dir, tokenizer=tokenizer)
    report.render(console)
    console.print(f"audit: {report.verdict}")
    return bool(report.passed)


STAGE_HOOKS = {"tokenize": {"gate": audit_tokenized_output}, "check": {"overfit": importlib.import_module("draftsmith.gates.overfit").run_overfit_gate}}

for _stage in STAGE_MODULES:
    importlib.import_module(f"draftsmith.{_stage}.cli").register(app, **STAGE_HOOKS.get(_stage, {}))

# `plan data` trains and evaluates, so it composes stages and cannot live in the plan stage itself.
importlib.import_module("draftsmith.datacurve.cli").register(
    next(group.typer_instance for group in app.registered_groups if group.name == "plan"))


def _resume_command(argv: list[str] | None) -> str:
    """The command line that continues this run after a failure: the same one, plus `--resume` for
    a stage that keeps an earlier run's output only when told to (tokenize, train)."""
    import shlex

    import typer.main

    args = list(sys.argv[1:] if argv is None else argv)
    stage = next((arg for arg in args if not arg.startswith("-")), None)
    command = getattr(typer.main.get_command(app), "commands", {}).get(stage)
    takes_resume = command is not None and any("--resume" in getattr(param, "opts", ()) for param in command.params)
    if takes_resume and "--resume" not in args:
        args = [arg for arg in args if arg != "--no-resume"] + ["--resume"]
    return shlex.join(["draftsmith", *args])


def main(argv: list[str] | None = None) -> int:
    """Entry point for the console script; returns the process exit code."""
    from draftsmith.core import signals

    signals.install()
    try:
        # With standalone_mode=False click returns a command's `typer.Exit(code)` instead of raising.
        result = app(args=argv, standalone_mode=False)
    except DiskFullError as error:  # the exact command that continues the work, not just "rerun"
        typer.echo(f"draftsmith: error: {redact(str(DiskFullError(error.where, _resume_command(argv))))}", err=True)
        return error.exit_code
    except DraftsmithError as error:
        typer.echo(f"draftsmith: error: {redact(str(error))}", err=True)
        return error.exit_code
    except OSError as error:
        # The file system refused a path the user gave (a file where a directory goes, a full
        # disk, no permission): their problem to fix, said in one line.
        from draftsmith.core.io import DISK_FULL

        if error.errno in DISK_FULL:  # a write deep in a stage (torch.save, a shard) has no file name
            typer.echo(f"draftsmith: error: {redact(str(DiskFullError(error.filename, _resume_command(argv))))}", err=True)
            return 2
        if error.filename is None:
            raise
        typer.echo(f"draftsmith: error: {error.filename}: {error.strerror or error}", err=True)
        return 2
    except ValidationError as error:  # a config built inside a stage from values the user gave
        typer.echo(f"draftsmith: error: {redact(describe_validation_error(error))}", err=True)
        return 2
    except (typer.Abort, KeyboardInterrupt):
        typer.echo(signals.describe(), err=True)
        return signals.exit_code()
    except Exception as error:  # click usage errors carry their own exit code
        import click

        # typer >= 0.20 raises its vendored click's exceptions, which are not click's own.
        if isinstance(error, (click.ClickException, typer.TyperException)) and hasattr(error, "show"):
            error.show()
            return error.exit_code
        raise
    if result == 130:  # typer turns Ctrl-C inside a command into Exit(130), said nowhere
        typer.echo(signals.describe(), err=True)
        return signals.exit_code()
    return result if isinstance(result, int) else 0


if __name__ == "__main__":
    sys.exit(main())
