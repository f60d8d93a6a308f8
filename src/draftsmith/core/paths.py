"""Model and tokenizer locations given on the command line.

transformers reads a path that does not exist as a Hugging Face Hub repo id and answers with the
hub's "Repo id must be in the form ..." message; a person who mistyped a directory should hear
that the directory does not exist.
"""

from __future__ import annotations

import os
from pathlib import Path

from draftsmith.core.errors import InputError


def require_dir(path: str | os.PathLike, what: str) -> Path:
    """`path` as a Path if it is a directory, else an `InputError` naming `what` (e.g. "--target")."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{what} {path}: no such directory")
    if not path.is_dir():
        raise InputError(f"{what} {path}: not a directory")
    return path


def dir_or_hub_id(path: str | os.PathLike, what: str) -> str:
    """A local directory, or a string the Hub accepts as a repo id ("Qwen/Qwen3-8B"); anything else
    (an absolute or relative path that is not there) is an `InputError` saying so."""
    text = str(path)
    if Path(text).exists():
        require_dir(text, what)
        return text
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError:
        raise InputError(f"{what} {text}: no such directory") from None
    return text


def require_output_dir(path: str | os.PathLike, what: str) -> Path:
    """`path` as a Path if it is a directory or can become one; a file in the way is an `InputError`.

    Checked before a stage does any work, so the run does not end in a traceback from `mkdir`.
    """
    path = Path(path)
    for candidate in (path, *path.parents):
        if candidate.exists():
            if not candidate.is_dir():
                shown = path if candidate == path else f"{path} ({candidate})"
                raise InputError(f"{what} {shown}: exists and is not a directory")
            break
    return path
