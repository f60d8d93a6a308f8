"""The two stateful parts of a run besides the model and optimizer, each saving and restoring itself.

`TrainState`: where the run is (step, epoch, step in epoch, tokens seen, the per-step losses) and
the process's RNG states. `MetricsAccumulator`: the training metrics of the current log window
(loss, greedy accuracy per block offset, the simulated acceptance length tau), accumulated on the
device without a host sync, and reduced over ranks only when they are read: at a log step, before
a checkpoint, at the end.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from draftsmith.core.errors import DraftsmithError
from draftsmith.train.checkpoints import numpy_rng_state, set_numpy_rng_state
from draftsmith.train.distributed import DistributedContext, all_reduce_sum


def rng_state() -> dict:
    return {
        "python": random.getstate(),
        "numpy": numpy_rng_state(),
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None,
    }


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    set_numpy_rng_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available() and state.get("cuda") is not None:
        torch.cuda.set_rng_state_all(state["cuda"])


@dataclass
class TrainState:
    """Where the run is; the data position (epoch, step_in_epoch) is the next step to train."""

    step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0
    tokens_seen: int = 0
    # Anchor coverage over the run, all ranks: trainable tokens predicted by some block / trainable tokens.
    covered_tokens: int = 0
    trainable_tokens: int = 0
    losses: list[tuple[int, float]] = field(default_factory=list)
    # `--eval-prompts`: the step of the last eval point and the best speculative tau so far.
    last_eval_step: int | None = None
    best_eval_tau: float | None = None
    best_eval_step: int | None = None

    @property
    def anchor_coverage(self) -> float:
        return self.covered_tokens / self.trainable_tokens if self.trainable_tokens else float("nan")

    def finish_step(self, epoch: int, step_in_epoch: int, last_in_epoch: bool) -> None:
        self.step += 1
        self.epoch, self.step_in_epoch = (epoch + 1, 0) if last_in_epoch else (epoch, step_in_epoch + 1)

    def state_dict(self) -> dict:
        return {"step": self.step, "epoch": self.epoch, "step_in_epoch": self.step_in_epoch,
                "tokens_seen": self.tokens_seen, "covered_tokens": self.covered_tokens,
                "trainable_tokens": self.trainable_tokens, "losses": [list(item) for item in self.losses], "rng": rng_state(),
                "eval": {"last_step": self.last_eval_step, "best_tau": self.best_eval_tau, "best_step": self.best_eval_step}}  # fmt: skip

    def load_state_dict(self, state: dict) -> None:
        self.step, self.epoch, self.step_in_epoch = int(state["step"]), int(state["epoch"]), int(state["step_in_epoch"])
        self.tokens_seen = int(state["tokens_seen"])
        # A checkpoint from before coverage was counted: the run's coverage counts from the resume on.
        self.covered_tokens, self.trainable_tokens = int(state.get("covered_tokens", 0)), int(state.get("trainable_tokens", 0))
        self.losses = [(int(step), float(loss)) for step, loss in state.get("losses", [])]
        evaluation = state.get("eval") or {}
        self.last_eval_step, self.best_eval_tau = evaluation.get("last_step"), evaluation.get("best_tau")
        self.best_eval_step = evaluation.get("best_step")
        set_rng_state(state["rng"])


class TrainingDiverged(DraftsmithError):
    """The loss or gradient norm became NaN or infinite: one line, exit 1 (the input was fine, the run was not)."""

    exit_code = 1


class SyncedStep(NamedTuple):
    """One optimizer step's numbers over all ranks, as `MetricsAccumulator.sync` returns them."""

    step: int
    loss: float
    tokens: int
    grad_norm: float
    covered_tokens: int = 0  # trainable tokens some block predicts
    trainable_tokens: int = 0


class MetricsAccumulator:
    """Per-step loss and per-window accuracy/tau, on the device; `sync` and `report` reduce over ranks.

    Per step: the sum of the micro-batches' shares of the step loss (`StepNormaliser.share`), the
    micro-batch count, the local token count and the gradient norm are kept as device values until
    `sync`, which all-reduces every pending step in one call and returns (step, loss, tokens,
    grad_norm) with loss the step's loss over every micro-batch of every rank (for the decay
    weighting: the mean of the micro-batch losses). Per window: greedy hits and counts per block offset, accepted
    prefixes and blocks, pooled over ranks by `report`.
    """

    def __init__(self, block_size: int, device: torch.device):
        self.device = device
        self.offsets = block_size - 1
        self._step_loss = torch.zeros((), dtype=torch.float64, device=device)
        self._step_micro = 0
        self._pending: list[tuple[int, torch.Tensor, torch.Tensor, tuple[int, int, int]]] = []  # step, loss [2], grad norm, counts
        self._window = torch.zeros(2 * self.offsets + 2, dtype=torch.float64, device=device)
        self._window_losses: list[float] = []

    def add_micro_batch(self, output, share: torch.Tensor) -> None:
        self._step_loss += share.detach().double()
        self._step_micro += 1
        stats = torch.cat([output.correct.double().flatten(), output.counted.double().flatten(),
                           output.accepted_prefix.double().reshape(1), output.blocks.double().reshape(1)])  # fmt: skip
        self._window += stats.to(self.device)

    def end_step(self, step: int, grad_norm: torch.Tensor, tokens: int, coverage: tuple[int, int] = (0, 0)) -> None:
        """`coverage`: (trainable tokens some block predicts, trainable tokens) of this rank's step."""
        values = torch.stack([self._step_loss, torch.tensor(float(self._step_micro), dtype=torch.float64, device=self.device)])
        self._pending.append((step, values, grad_norm.detach().double().reshape(()), (tokens, *coverage)))
        self._step_loss = torch.zeros((), dtype=torch.float64, device=self.device)
        self._step_micro = 0

    def sync(self, context: DistributedContext) -> list[SyncedStep]:
        """The pending steps as host numbers, reduced over ranks (one collective, one host sync)."""
        if not self._pending:
            return []
        local = torch.stack(
            [torch.cat([values, norm.reshape(1).to(values), torch.tensor([float(c) for c in counts], dtype=torch.float64, device=values.device)])
             for _, values, norm, counts in self._pending]
        )  # fmt: skip
        reduced = all_reduce_sum(local, context).cpu()
        steps = [step for step, _, _, _ in self._pending]
        self._pending.clear()
        synced = []
        for step, (loss, _micro, norm_sum, tokens, covered, trainable) in zip(steps, reduced.tolist(), strict=True):
            synced.append(SyncedStep(step, loss, int(tokens), norm_sum / context.world_size, int(covered), int(trainable)))
            self._window_losses.append(loss)
        return synced

    def report(self, context: DistributedContext) -> dict:
        """Loss (mean of the window's steps), accuracy per offset and tau, pooled over ranks; resets the window."""
        window = all_reduce_sum(self._window, context).cpu()
        correct, counted = window[: self.offsets], window[self.offsets : 2 * self.offsets]
        prefix, blocks = float(window[-2]), float(window[-1])
        losses = self._window_losses or [math.nan]
        record = {
            "loss": sum(losses) / len(losses),
            "acc_by_offset": [round(float(value), 4) for value in correct / counted.clamp_min(1)],
            "train_tau": 1 + prefix / max(blocks, 1.0),
        }
        self._window.zero_()
        self._window_losses = []
        return record

    def state_dict(self) -> dict:
        if self._pending or self._step_micro:
            raise RuntimeError("MetricsAccumulator.state_dict needs sync() first")
        return {"window": self._window.cpu(), "window_losses": list(self._window_losses)}

    def load_state_dict(self, state: dict) -> None:
        self._window = state["window"].to(self.device, torch.float64)
        self._window_losses = [float(value) for value in state["window_losses"]]


def first_nonfinite(synced) -> tuple[int, str] | None:
    for step, loss, _, grad_norm, *_ in synced:
        if not math.isfinite(loss):
            return step, f"loss {loss}"
        if not math.isfinite(grad_norm):
            return step, f"gradient norm {grad_norm}"
    return None
