"""Training checkpoints: the `Checkpointer` (save, latest, fallback, restore, final publish) and the log.

A checkpoint `checkpoints/step-NNNNNNNN/` holds, written under `.step-N.partial` and renamed:
  - the drafter weights, ONCE: `config.json` + `model.safetensors` (the format `export` and engines
    read) in a replicated run; under `--sharding fsdp` a `torch.distributed.checkpoint` directory
    `sharded/` with the drafter and optimizer state, each rank writing its own shards;
  - `trainer_state.pt`: the train state (step, data position, losses, RNG), the scheduler, the
    metrics window, the run's config and, in a replicated run, the optimizer.

`trainer_state.pt` is loaded with `weights_only=True`: it holds only tensors, numbers, strings and
containers, so a checkpoint from someone else cannot run code when resumed. A checkpoint that does
not load (a truncated copy, a full disk, a file that is not ours) is skipped for the next older one,
and the skip is said on stderr, because silently training from an older step would be a surprise.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

from draftsmith.core.errors import InputError
from draftsmith.core.io import (atomic_path, disk_full_as_one_line, fresh_dir, publish, refuse_link, write_atomic,
                                write_json_atomic)

CHECKPOINT_DIR = "checkpoints"
STATE_FILE = "trainer_state.pt"
RECORD_FILE = "record.json"  # beside a published drafter: what made it (the best eval's tau and step)


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
            # Memory-mapped: the optimizer state is paged in while it is copied into the optimizer.
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except FileNotFoundError:
        raise InputError(f"{path}: missing") from None
    except Exception as error:  # truncated zip, bad pickle opcode, a global we refuse to build
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise InputError(f"{path}: cannot be loaded safely ({reason})") from None
    required = ("step", "epoch", "step_in_epoch", "tokens_seen", "scheduler", "rng", "config")
    missing = [key for key in required if not isinstance(state, dict) or key not in state]
    if missing:
        raise InputError(f"{path}: not a draftsmith trainer state (missing {', '.join(missing)})")
    return state


def check_checkpoint_weights(checkpoint: Path, state: dict) -> None:
    """Refuse a checkpoint whose weights are missing or cut short (a full disk, a copy that stopped,
    a kill while an older run pruned it): checked by size and header, without reading the tensors."""
    from draftsmith.model.io import WEIGHTS_NAME
    from draftsmith.model.safetensors_file import read_safetensors_header

    if "drafter_state" in state:  # written before the weights were stored once, beside the state
        return
    if (checkpoint / SHARDED_DIR).is_dir():
        if not (checkpoint / SHARDED_DIR / ".metadata").is_file():
            raise InputError(f"{checkpoint / SHARDED_DIR}: missing its .metadata (the sharded save did not finish)")
        return
    read_safetensors_header(checkpoint / WEIGHTS_NAME)


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
            check_checkpoint_weights(checkpoint, state)
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
    path = refuse_link(path)  # the log is appended to next: never through a link
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
        write_atomic(path, "".join(line + "\n" for line in kept))
    return dropped


SHARDED_DIR = "sharded"
DISCARDED = ".discarded"


def discard(directory: Path) -> None:
    """Delete a checkpoint (or published drafter) directory so that a kill half-way leaves nothing
    under its name: it is renamed to a hidden name first (atomic), then deleted; a later save sweeps
    what a killed deletion left."""
    directory = Path(directory)
    if directory.is_symlink():
        directory.unlink()
        return
    if not directory.exists():
        return
    hidden = directory.with_name(f".{directory.name}{DISCARDED}")
    shutil.rmtree(hidden, ignore_errors=True)
    directory.rename(hidden)
    shutil.rmtree(hidden, ignore_errors=True)


def step_name(step: int) -> str:
    return f"step-{step:08d}"


class Checkpointer:
    """One home for checkpoints: save, the newest intact one, restore, pruning and the final drafter.

    `states` maps names to objects with `state_dict()`/`load_state_dict()` (the train state, the
    scheduler, the metrics); the drafter and optimizer go through `model_io`'s sharded or
    replicated path. `save` is collective: every rank calls it.
    """

    def __init__(self, out_dir: Path, context, model, optimizer, states: dict, *, keep: int, config: dict):
        self.root = Path(out_dir) / CHECKPOINT_DIR
        self.context, self.model, self.optimizer, self.states = context, model, optimizer, states
        self.keep, self.config = keep, config
        from draftsmith.train.parallel import is_sharded

        self.sharded = is_sharded(model)
        self.last_saved: int | None = None

    def latest(self) -> Path | None:
        newest = checkpoints_newest_first(self.root.parent)
        return newest[0] if newest else None

    def find(self) -> tuple[Path, dict] | None:
        """The newest checkpoint whose trainer state loads (older ones tried in turn), or None."""
        return newest_intact_checkpoint(self.root.parent)

    def restore(self, found: tuple[Path, dict]) -> int:
        """Load model, optimizer and every state from `found`, then drop the loaded copies; returns the step."""
        checkpoint, saved = found
        if self.sharded:
            self._load_sharded(checkpoint)
        else:
            self._load_replicated(checkpoint, saved)
        for name, stateful in self.states.items():
            if name == "train" or name in saved:  # older checkpoints have no metrics window
                stateful.load_state_dict(saved if name == "train" else saved[name])
        self.last_saved = int(saved["step"])
        saved.clear()  # the caller's reference holds nothing more: optimizer state lives in the optimizer now
        return self.last_saved

    def _load_replicated(self, checkpoint: Path, saved: dict) -> None:
        from draftsmith.model.io import WEIGHTS_NAME, mask_embedding_state, read_safetensors

        inner = getattr(self.model, "module", self.model)
        weights = saved.pop("drafter_state", None)  # checkpoints written before the weights were stored once
        if weights is None:
            weights = {**read_safetensors(checkpoint / WEIGHTS_NAME), **mask_embedding_state(checkpoint, inner.config)}
        inner.load_state_dict(weights, strict=False)
        del weights
        if "optimizer" not in saved:
            raise InputError(f"{checkpoint}: written by a sharded run; resume it with --sharding fsdp")
        try:
            self.optimizer.load_state_dict(saved.pop("optimizer"))
        except ValueError as error:  # another optimizer's groups (a checkpoint whose recorded config was edited)
            raise InputError(f"{checkpoint}: its optimizer state does not fit this run's optimizer ({error})") from None

    def _load_sharded(self, checkpoint: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

        if not (checkpoint / SHARDED_DIR).is_dir():
            raise InputError(f"{checkpoint}: written by a replicated run; resume it with --sharding ddp")
        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        dcp.load(state, checkpoint_id=str(checkpoint / SHARDED_DIR))
        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])

    def save(self, step: int) -> Path:
        """Write the checkpoint of `step` (all ranks), publish it atomically and prune old ones."""
        from draftsmith.train.distributed import barrier

        final, partial = self.root / step_name(step), self.root / f".{step_name(step)}.partial"
        if self.context.is_main:
            self.root.mkdir(parents=True, exist_ok=True)
            for leftover in [*self.root.glob(".step-*.partial"), *self.root.glob(f".*{DISCARDED}")]:
                shutil.rmtree(leftover, ignore_errors=True)  # of a killed save or prune: one writer per --out
            fresh_dir(partial)
        barrier(self.context)
        state = {**self.states["train"].state_dict(), "config": self.config}
        state.update({name: stateful.state_dict() for name, stateful in self.states.items() if name != "train"})
        try:
            # A full disk (safetensors, torch.save and DCP each say it their own way) is one line;
            # the half-written checkpoint is removed, never published, and its space given back.
            with disk_full_as_one_line(partial):
                self._write(partial, state)
        except BaseException:
            if self.context.is_main:
                shutil.rmtree(partial, ignore_errors=True)
            raise
        if self.context.is_main:
            discard(final)
            publish(partial, final)
            for old in checkpoints_newest_first(self.root.parent)[self.keep :]:
                discard(old)
        barrier(self.context)
        self.last_saved = step
        return final

    def _write(self, partial: Path, state: dict) -> None:
        if self.sharded:
            self._save_sharded(partial)
        elif self.context.is_main:
            from draftsmith.model import save_drafter

            save_drafter(self.model, partial)
            state["optimizer"] = self.optimizer.state_dict()
        if self.context.is_main:
            with atomic_path(partial / STATE_FILE) as temporary, open(temporary, "wb") as handle:
                torch.save(state, handle)  # through a Python file: a failed write keeps its OSError as the cause

    def _save_sharded(self, partial: Path) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_state, optimizer_state = get_state_dict(self.model, self.optimizer)
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(partial / SHARDED_DIR))
        if self.context.is_main:
            self.model.config.to_json_file(str(partial / "config.json"))  # what the run was, for people

    def publish_final(self, drafter_config, out_dir: Path, name: str, record: dict | None = None) -> Path:
        """The trained drafter as `<out>/<name>` (config.json + model.safetensors), gathered from the
        shards; `record` (JSON) lands beside them as `record.json` in the same atomic publish."""
        from draftsmith.model import save_drafter
        from draftsmith.model.io import drafter_class
        from draftsmith.train.distributed import barrier
        from draftsmith.train.parallel import full_state_dict

        state = full_state_dict(self.model)  # collective under FSDP; whole on rank 0
        final = Path(out_dir) / name
        if self.context.is_main:
            if self.sharded:
                drafter = drafter_class(drafter_config)(drafter_config)
                drafter.load_state_dict(state, strict=False)
            else:
                drafter = self.model
            partial = fresh_dir(Path(out_dir) / f".{name}.partial")
            try:
                with disk_full_as_one_line(partial):
                    save_drafter(drafter, partial)
                    if record is not None:
                        write_json_atomic(partial / RECORD_FILE, record)
            except BaseException:
                shutil.rmtree(partial, ignore_errors=True)
                raise
            discard(final)
            publish(partial, final)
        del state
        barrier(self.context)
        return final
