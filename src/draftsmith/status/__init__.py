"""`draftsmith status`: watch a stage's output directory (or the shards of several nodes) and re-plan
the job from what it has done, reading only what the stage writes (see `generate_view`, `stage_views`).

    from draftsmith.status import StatusConfig, status
    summary = status(StatusConfig(dirs=["out/gen"]))
    summary.state, summary.eta_s, summary.exit_code
"""

from __future__ import annotations

import re
from pathlib import Path

from draftsmith.core.errors import InputError
from draftsmith.core.lock import directory_owner
from draftsmith.core.units import parse_duration
from draftsmith.status.config import StatusConfig, StatusSummary
from draftsmith.status.curve_view import CURVE_FILE, RUNS_FILE, curve_status
from draftsmith.status.generate_view import generate_status
from draftsmith.status.reading import list_directory
from draftsmith.status.stage_views import other_status, train_status

STAGES = ("generate", "tokenize", "extract", "train", "export", "plan data")

__all__ = ["StatusConfig", "StatusSummary", "status"]


def parse_interval(text: str, flag: str) -> float:
    """A watch interval or window: a duration ("90s", "1h"), "10m" as minutes (a window is never
    months), or bare seconds ("5")."""
    stripped = str(text).strip()
    if re.fullmatch(r"\d+(\.\d+)?", stripped) and float(stripped) > 0:
        return float(stripped)
    return parse_duration(re.sub(r"(\d)m$", r"\1min", stripped), flag)


def _stage_of(directory: Path) -> str:
    list_directory(directory)  # missing, not a directory or unreadable: one line naming it
    owner = directory_owner(directory)
    if owner is None:
        raise InputError(f"{directory}: not a draftsmith output directory (no owner record, manifest or stage files); "
                         f"status reads the output of {', '.join(STAGES)}")  # fmt: skip
    if owner == "plan" and any((directory / name).exists() for name in (RUNS_FILE, CURVE_FILE)):
        return "plan data"  # the owner record keeps a command's first word; plan data is the plan that owns a directory
    if owner not in STAGES:
        raise InputError(f"{directory}: belongs to `{owner}`; status reads the output of {', '.join(STAGES)}")
    return owner


def status(config: StatusConfig) -> StatusSummary:
    """The status of the directories (read only; the writer is never disturbed)."""
    window_s = parse_interval(config.window, "--window")
    stall_s = parse_interval(config.stall_after, "--stall-after")
    directories: list[Path] = []
    for directory in config.dirs:  # one directory named twice is counted once
        if Path(directory).resolve() not in [d.resolve() for d in directories]:
            directories.append(Path(directory))
    if not directories:
        raise InputError("status needs at least one output directory")
    stages = {directory: _stage_of(directory) for directory in directories}
    kinds = set(stages.values())
    if len(kinds) > 1:
        shown = ", ".join(f"{d} ({s})" for d, s in stages.items())
        raise InputError(f"the directories belong to different stages ({shown}); give one stage's directories")
    stage = kinds.pop()
    if stage == "generate":
        return generate_status(directories, config, window_s, stall_s)
    if len(directories) > 1:
        raise InputError(f"several {stage} directories: status aggregates the shards of generate only; give one")
    if stage == "train":
        return train_status(directories[0], window_s, stall_s)
    if stage == "plan data":
        return curve_status(directories[0], window_s, stall_s)
    return other_status(stage, directories[0], stall_s)
