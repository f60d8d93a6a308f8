"""Reading training checkpoints back safely, and the log that goes with them.

`trainer_state.pt` is loaded with `weights_only=True`: it holds only tensors, numbers, strings and
containers, so a checkpoint from someone else cannot run code when resumed. A checkpoint that does
not load (a truncated copy, a full disk, a file that is not ours) is skipped for the next older one,
and the skip is said on stderr, because silently training from an older step would be a surprise.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import torch

from draftsmith.core.errors import InputError

CHECKPOINT_DIR = "checkpoints"
STATE_FILE = "trainer_state.pt"


def numpy_rng_state() -> dict:
    """numpy's global RNG state as plain values (its own form holds an ndarray, which needs pickle)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {"bit_generator": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
            "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}  # fmt: skip


def set_numpy_rng_state(state) -> None:
    if isinstance(state, dict):
        keys = state["keys"].numpy().astype(np.uint32)
        state = (state["bit_generator"], keys, state["pos"], state["has_gauss"], state["cached_gaussian"])
    np.random.set_state(state)


def _numpy_array_globals() -> list:
    # Checkpoints written before the state went plain hold numpy's RNG keys as an ndarray; these
    # are the constructors needed to rebuild one and nothing else.
    core = getattr(np, "_core", None) or np.core
    return [core.multiarray._reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def load_trainer_state(checkpoint: Path) -> dict:
    """The trainer state of one checkpoint, or `InputError` saying why it is unusable."""
    path = Path(checkpoint) / STATE_FILE
    try:
        with torch.serialization.safe_globals(_numpy_array_globals()):
            state = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise InputError(f"{path}: missing") from None
    except Exception as error:  # truncated zip, bad pickle opcode, a global we refuse to build
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise InputError(f"{path}: cannot be loaded safely ({reason})") from None
    required = ("step", "epoch", "step_in_epoch", "tokens_seen", "optimizer", "scheduler", "drafter_state", "rng", "config")
    missing = [key for key in required if not isinstance(state, dict) or key not in state]
    if missing:
        raise InputError(f"{path}: not a draftsmith trainer state (missing {', '.join(missing)})")
    return state


def checkpoints_newest_first(out_dir: Path) -> list[Path]:
    root = Path(out_dir) / CHECKPOINT_DIR
    if not root.exists():
        return []
    return sorted((path for path in root.glob("step-*") if (path / STATE_FILE).exists()), reverse=True)


def newest_intact_checkpoint(out_dir: Path) -> tuple[Path, dict] | None:
    """The newest checkpoint whose state loads, saying on stderr which newer ones were skipped."""
    candidates = checkpoints_newest_first(out_dir)
    skipped: list[str] = []
    for checkpoint in candidates:
        try:
            state = load_trainer_state(checkpoint)
        except InputError as error:
            skipped.append(str(error))
            continue
        for reason in skipped:
            print(f"draftsmith: warning: skipping checkpoint {reason}; resuming from {checkpoint.name}", file=sys.stderr)
        return checkpoint, state
    if skipped:
        raise InputError(f"{out_dir}: no intact checkpoint to resume from; newest: {skipped[0]}")
    return None


def cut_log(path: Path, step: int) -> int:
    """Drop log records after `step` (written after the checkpoint we resume from); returns how many.

    A line cut short by a kill is dropped too. The file is rewritten through a rename, so a
    second kill during the cut leaves either the old log or the new one.
    """
    path = Path(path)
    if not path.exists():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            record_step = json.loads(line)["step"]
        except (ValueError, KeyError, TypeError):
            dropped += 1
            continue
        if isinstance(record_step, int) and record_step <= step:
            kept.append(line)
        else:
            dropped += 1
    if dropped:
        partial = path.with_name(path.name + ".partial")
        partial.write_text("".join(line + "\n" for line in kept), encoding="utf-8")
        os.replace(partial, path)
    return dropped
