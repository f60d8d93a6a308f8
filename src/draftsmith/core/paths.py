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


#: The longest file name (in bytes) the file systems draftsmith runs on take.
NAME_MAX = 255


def sibling_name(path: str | os.PathLike, prefix: str = ".", suffix: str = "") -> Path:
    """``prefix + name + suffix`` beside ``path``: a helper name (a lock, a staging folder, a
    temporary) of a name draftsmith was given. A legal name near the 255-byte limit would not fit
    with the additions, so it is then cut, and a digest of the whole name keeps it that name's own."""
    import hashlib

    path = Path(path)
    name = os.fsencode(path.name)
    extra = os.fsencode(prefix) + os.fsencode(suffix)
    if len(name) + len(extra) <= NAME_MAX:
        return path.with_name(prefix + path.name + suffix)
    digest = hashlib.sha256(name).hexdigest()[:16].encode()
    head = name[: NAME_MAX - len(extra) - len(digest) - 1]
    return path.with_name(os.fsdecode(os.fsencode(prefix) + head + b"~" + digest + os.fsencode(suffix)))


def require_utf8_path(path: str | os.PathLike, what: str) -> Path:
    """``path``, if it is valid UTF-8 (Arrow and safetensors take only UTF-8 paths; Python keeps
    a name's other bytes as surrogates, which those libraries refuse mid-run): else an `InputError`,
    raised before anything is made."""
    path = Path(path)
    text = str(path.absolute())
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        bad = os.fsencode(text[error.start : error.end])
        shown = os.fsencode(str(path)).decode("utf-8", "backslashreplace")  # printable on any terminal
        raise InputError(f"{what} {shown}: its path holds bytes that are not UTF-8 ({bad!r}); the Arrow files "
                         f"draftsmith reads and writes need UTF-8 paths: rename it") from None  # fmt: skip
    return path
