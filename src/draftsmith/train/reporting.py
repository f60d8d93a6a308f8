"""Training curves for people: `--report-to tensorboard|wandb|none`, as Hugging Face's Trainer does.

Scalars follow the Trainer's names under `train/`: loss, learning_rate, grad_norm, epoch, plus the
drafter's own tokens_per_s, tau (the training estimate of the acceptance length) and acc_offset_k,
the greedy accuracy at block offset k. TensorBoard writes under `<out>/runs/<time>_<host>` like the
Trainer's default logging_dir; wandb is imported only when asked for, so it stays optional.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path
from typing import Any, Protocol

from draftsmith.core.errors import InputError

REPORT_TARGETS = ("none", "tensorboard", "wandb")
RUNS_DIR = "runs"


class Reporter(Protocol):
    def log(self, step: int, record: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def scalars_from_record(record: dict[str, Any]) -> dict[str, float]:
    """The `train_log.jsonl` record of a log point as `train/...` scalars."""
    names = {
        "loss": "train/loss",
        "lr": "train/learning_rate",
        "grad_norm": "train/grad_norm",
        "epoch": "train/epoch",
        "tokens_per_s": "train/tokens_per_s",
        "train_tau": "train/tau",
        "anchor_coverage": "train/anchor_coverage",
        "eval_tau": "eval/tau",
    }
    scalars = {name: float(record[key]) for key, name in names.items() if key in record}
    for offset, accuracy in enumerate(record.get("acc_by_offset", []), start=1):
        scalars[f"train/acc_offset_{offset}"] = float(accuracy)
    return scalars


class _NoReporter:
    def log(self, step: int, record: dict[str, Any]) -> None:
        pass

    def close(self) -> None:
        pass


class TensorBoardReporter:
    def __init__(self, out_dir: Path, config: dict[str, Any]):
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError as error:
            raise InputError(f"--report-to tensorboard needs the tensorboard package ({error}); pip install tensorboard") from None
        self.log_dir = Path(out_dir) / RUNS_DIR / f"{time.strftime('%b%d_%H-%M-%S')}_{socket.gethostname()}"
        self.writer = SummaryWriter(log_dir=str(self.log_dir))
        self.writer.add_text("train/config", "\n".join(f"    {key}: {value}" for key, value in sorted(config.items())))

    def log(self, step: int, record: dict[str, Any]) -> None:
        for name, value in scalars_from_record(record).items():
            self.writer.add_scalar(name, value, global_step=step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbReporter:
    def __init__(self, out_dir: Path, config: dict[str, Any]):
        try:
            import wandb
        except ImportError:
            raise InputError("--report-to wandb needs the wandb package, which is not installed (pip install wandb)") from None
        self.wandb = wandb
        self.run = wandb.init(project=os.environ.get("WANDB_PROJECT", "draftsmith"), config=config, dir=str(out_dir))

    def log(self, step: int, record: dict[str, Any]) -> None:
        self.run.log(scalars_from_record(record), step=step)

    def close(self) -> None:
        self.run.finish()


def check_report_to(report_to: str) -> None:
    """Fail before any model loads when the asked-for reporter cannot run."""
    if report_to not in REPORT_TARGETS:
        raise InputError(f"--report-to must be one of {', '.join(REPORT_TARGETS)}, got {report_to!r}")
    module = {"tensorboard": "tensorboard", "wandb": "wandb"}.get(report_to)
    if module is not None:
        import importlib.util

        if importlib.util.find_spec(module) is None:
            raise InputError(f"--report-to {report_to} needs the {module} package, which is not installed (pip install {module})")


def make_reporter(report_to: str, out_dir: Path, config: dict[str, Any]) -> Reporter:
    check_report_to(report_to)
    if report_to == "tensorboard":
        return TensorBoardReporter(out_dir, config)
    if report_to == "wandb":
        return WandbReporter(out_dir, config)
    return _NoReporter()
