"""Errors that the CLI turns into one clear line and exit code 2."""

from __future__ import annotations


class DraftsmithError(Exception):
    """A problem with the user's input or environment, reported without a traceback.

    The message should name the file, line or sample and the problem, so a person can fix it
    without reading code.
    """

    exit_code = 2


class InputError(DraftsmithError):
    """Bad or missing input: a file, a flag, a field, a value."""
