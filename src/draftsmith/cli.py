"""The `draftsmith` command: a thin layer over the Python API, one sub-command per stage.

Each stage module exposes `register(app)` that adds its command(s); this file only wires them and
turns `DraftsmithError` into a one-line message with exit code 2.
"""

from __future__ import annotations

import sys

import typer

from draftsmith import __version__
from draftsmith.errors import DraftsmithError

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


# Stage registrations: each stage's module adds its own commands.
from draftsmith.tiny.cli import register as _register_tiny  # noqa: E402

_register_tiny(app)

from draftsmith.serve.cli import register as _register_serve  # noqa: E402

_register_serve(app)

from draftsmith.generate.cli import register as _register_generate  # noqa: E402

_register_generate(app)

from draftsmith.bench.cli import register as _register_bench  # noqa: E402

_register_bench(app)


def main(argv: list[str] | None = None) -> int:
    """Entry point for the console script; returns the process exit code."""
    try:
        # With standalone_mode=False click returns a command's `typer.Exit(code)` instead of raising.
        result = app(args=argv, standalone_mode=False)
        if isinstance(result, int) and not isinstance(result, bool):
            return result
    except DraftsmithError as error:
        typer.echo(f"draftsmith: error: {error}", err=True)
        return error.exit_code
    except typer.Exit as exit_:
        return exit_.exit_code
    except (typer.Abort, KeyboardInterrupt):
        typer.echo("draftsmith: interrupted", err=True)
        return 130
    except Exception as error:  # click usage errors carry their own exit code
        import click

        if isinstance(error, click.ClickException):
            error.show()
            return error.exit_code
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
