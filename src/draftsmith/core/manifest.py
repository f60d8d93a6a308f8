"""`manifest.json`: the settings an output directory was written with, checked on every resume.

A resumed run appends to what an earlier run wrote, so both must have used the same settings that
shape the output (model, sampling, template arguments, max tokens, tokenizer, block size...);
otherwise the directory silently mixes two datasets. The first run writes the manifest; a later
run with different settings is refused, naming each differing key, unless it is forced (then the
manifest records the change).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from draftsmith.core.config import check_numbers
from draftsmith.core.errors import InputError
from draftsmith.core.io import read_json_file, write_json_atomic

MANIFEST_NAME = "manifest.json"


def _plain(value: Any) -> Any:
    """Settings as JSON sees them, so tuples/lists and Paths/strings compare equal across runs."""
    return json.loads(json.dumps(value, default=str, sort_keys=True))


def _short(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 200 else text[:197] + "..."


def settings_differences(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """`key: old -> new` for every setting that differs (a key missing on one side counts)."""
    return [
        f"{key}: {_short(old.get(key))} -> {_short(new.get(key))}"
        for key in sorted(set(old) | set(new))
        if old.get(key) != new.get(key)
    ]


def check_manifest(
    directory: str | os.PathLike,
    stage: str,
    settings: dict[str, Any],
    *,
    force: bool = False,
    force_flag: str | None = "--force-resume",
    log: Callable[[str], None] | None = None,
    assumed: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Write `directory/manifest.json` for a new output, or check a resumed one against `settings`.

    Raises `InputError` (exit 2) naming the differing keys as `old -> new` unless `force`;
    `force_flag=None` for a stage whose outputs can never be mixed (nothing to force).
    `assumed`: settings a manifest written before they were recorded lacks, with the value they
    had then; such a manifest is compared as if it held them, and rewritten with them recorded.
    """
    directory = Path(directory)
    path = directory / MANIFEST_NAME
    # The one number rule (core.config) for a config built in Python without the CLI: a NaN setting
    # would make the manifest unreadable as JSON and the run impossible to resume.
    check_numbers(settings, lambda loc: ".".join(loc) if loc else None)
    settings = _plain(settings)
    if path.exists():
        manifest = read_json_file(path, "run manifest")
        if not isinstance(manifest, dict) or not isinstance(manifest.get("settings"), dict):
            raise InputError(f"{path}: not a draftsmith run manifest (no settings)")
        if manifest.get("stage") != stage:
            raise InputError(f"{directory}: holds the output of `{manifest.get('stage')}`, not `{stage}`; use another directory")
        unrecorded = {key: value for key, value in _plain(assumed or {}).items() if key not in manifest["settings"]}
        differences = settings_differences({**unrecorded, **manifest["settings"]}, settings)
        if not differences:
            if unrecorded:  # recorded from now on, as this run's settings
                manifest = {**manifest, "settings": {**manifest["settings"], **unrecorded}}
                write_json_atomic(path, manifest)
            return manifest
        if not force:
            remedy = f", or pass {force_flag} to continue anyway" if force_flag else ""
            raise InputError(
                f"{directory}: was written with other settings ({'; '.join(differences)}); resuming would mix "
                f"two runs: use a new output directory{remedy}"
            )
        (log or (lambda message: print(message, file=sys.stderr, flush=True)))(
            f"draftsmith: warning: {directory}: continuing with changed settings ({'; '.join(differences)}) "
            f"because of {force_flag}"
        )
        history = list(manifest.get("history", []))
        history.append({"time": manifest.get("time"), "settings": manifest["settings"]})
        manifest = {**manifest, "settings": settings, "history": history, "time": _now()}
    else:
        from draftsmith import __version__

        manifest = {"stage": stage, "draftsmith_version": __version__, "time": _now(), "settings": settings}
    directory.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, manifest)
    return manifest


def read_manifest(directory: str | os.PathLike) -> dict[str, Any] | None:
    path = Path(directory) / MANIFEST_NAME
    return read_json_file(path, "run manifest") if path.exists() else None


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


# The files of a model or tokenizer directory that decide how text becomes tokens.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "chat_template.json",
                    "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model")  # fmt: skip


def tokenizer_fingerprint(path: str | os.PathLike) -> str:
    """sha256 over a tokenizer directory's vocabulary and chat template files (a hub id as given)."""
    directory = Path(path)
    if not directory.is_dir():
        return f"name:{path}"
    digest = hashlib.sha256()
    found = False
    for name in _TOKENIZER_FILES:
        file = directory / name
        if file.is_file():
            found = True
            digest.update(name.encode() + b"\0")
            with file.open("rb") as handle:
                for block in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(block)
    return "sha256:" + digest.hexdigest()[:32] if found else f"dir:{directory.resolve()}"


def set_complete(directory: str | os.PathLike, complete: bool) -> None:
    """Mark the run recorded in the manifest finished (or, at the start of a resume, not yet)."""
    path = Path(directory) / MANIFEST_NAME
    manifest = read_json_file(path, "run manifest")
    if manifest.get("complete") != complete:
        write_json_atomic(path, {**manifest, "complete": complete})


def require_complete(directory: str | os.PathLike, what: str, rerun: str, allow_partial: bool = False) -> list[str]:
    """Refuse an output whose manifest says its run never finished (killed, still running, or
    stopped by its own error gate). With ``allow_partial`` it is used on purpose: said on stderr and
    returned as a note for the reader's manifest (`record_partial_inputs`)."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    manifest = read_manifest(directory)
    if manifest is not None and manifest.get("complete") is False:
        note = (f"{directory}: {what} is incomplete: the `{manifest.get('stage')}` run that writes it did not finish "
                "(killed, still running, or stopped on errors)")
        if not allow_partial:
            raise InputError(f"{note}; {rerun}, or pass --allow-partial to use it as it is")
        print(f"draftsmith: warning: {note}; using it as it is (--allow-partial)", file=sys.stderr, flush=True)
        return [note]
    return []


def record_partial_inputs(directory: str | os.PathLike, notes: list[str]) -> None:
    """Record in the manifest that this output was made from partial inputs on purpose
    (``--allow-partial``): ``partial_inputs`` keeps every such note of every run that wrote it."""
    if not notes:
        return
    path = Path(directory) / MANIFEST_NAME
    manifest = read_json_file(path, "run manifest")
    recorded = list(manifest.get("partial_inputs") or [])
    write_json_atomic(path, {**manifest, "partial_inputs": recorded + [f"{_now()} {note}" for note in notes]})
