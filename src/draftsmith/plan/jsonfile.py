"""Reading a small JSON file with errors that name the file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from draftsmith.core.errors import InputError


def read_json_file(path: Path, what: str) -> Any:
    if not path.is_file():
        raise InputError(f"{path}: no such {what}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise InputError(f"{path}: not valid JSON ({error})") from None
