"""Disk needed to train a drafter offline on stored target hidden states (contract 4).

Offline training stores, for every token of every sample (prompt included, since the drafter
conditions on the context), the hidden states of the captured target layers:
`bytes_per_token = num_captured_layers * hidden_size * dtype_bytes`. When that does not fit the
disk budget, the hidden states have to be recomputed by running the target during training
("online"), which costs target GPU time every epoch instead of disk.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from draftsmith.core.config import dtype_bytes
from draftsmith.core.errors import InputError
from draftsmith.core.units import format_bytes, format_count
from draftsmith.model.shape import language_sections, read_model_config

# Offline storage has to leave room for the tokenized data, checkpoints and a shard being written.
USABLE_DISK_FRACTION = 0.8
# Without a budget, compare against one node's local NVMe, the disk offline training usually reads from.
ASSUMED_DISK_BYTES = 8 * 10**12


class StorageEstimate(BaseModel):
    hidden_size: int
    num_captured_layers: int
    dtype: str
    dtype_bytes: int
    total_tokens: int
    num_samples: int
    bytes_per_token: int
    bytes_per_sample: float
    total_bytes: int
    disk_bytes: int | None
    disk_assumed: bool
    recommendation: str  # "offline" or "online"
    reason: str

    def summary(self) -> str:
        return (
            f"Offline hidden states: {format_count(self.num_samples)} samples x "
            f"{self.total_tokens / self.num_samples:,.0f} tokens (prompt included) x "
            f"{self.num_captured_layers} captured layers x hidden {self.hidden_size} x {self.dtype_bytes} bytes "
            f"({self.dtype}) = {format_bytes(self.bytes_per_token)} per token, "
            f"{format_bytes(self.bytes_per_sample)} per sample, {format_bytes(self.total_bytes)} in total. "
            f"Recommendation: {self.recommendation} training; {self.reason}."
        )


def dtype_size(dtype: str) -> int:
    return dtype_bytes(dtype)


def estimate_hidden_state_storage(
    hidden_size: int,
    num_captured_layers: int,
    total_tokens: int,
    num_samples: int,
    dtype: str = "bfloat16",
    disk_bytes: int | None = None,
) -> StorageEstimate:
    """Bytes to store the captured hidden states of every token, and offline vs online advice.

    `total_tokens` counts every token that goes through the target (prompt + completion) over
    all `num_samples`. `disk_bytes` is the budget; without one, a single node's local NVMe
    (`ASSUMED_DISK_BYTES`) is assumed and the reason says so.
    """
    for name, value in (
        ("hidden_size", hidden_size),
        ("num_captured_layers", num_captured_layers),
        ("num_samples", num_samples),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InputError(f"{name} must be a positive integer, got {value!r}")
    if isinstance(total_tokens, bool) or not isinstance(total_tokens, int) or total_tokens < 0:
        raise InputError(f"total_tokens must be a non-negative integer, got {total_tokens!r}")
    if disk_bytes is not None and (not isinstance(disk_bytes, int) or disk_bytes <= 0):
        raise InputError(f"disk_bytes must be a positive integer, got {disk_bytes!r}")
    width = dtype_size(dtype)
    bytes_per_token = num_captured_layers * hidden_size * width
    total_bytes = bytes_per_token * total_tokens
    budget = disk_bytes if disk_bytes is not None else ASSUMED_DISK_BYTES
    usable = int(budget * USABLE_DISK_FRACTION)
    budget_text = (
        f"the {format_bytes(budget)} disk budget"
        if disk_bytes is not None
        else f"an assumed {format_bytes(budget)} local disk (no disk budget given)"
    )
    if total_bytes <= usable:
        recommendation = "offline"
        reason = (
            f"{format_bytes(total_bytes)} fits in {budget_text} "
            f"({total_bytes / budget:.0%} of it, under the {USABLE_DISK_FRACTION:.0%} usable)"
        )
    else:
        recommendation = "online"
        reason = (
            f"{format_bytes(total_bytes)} is {total_bytes / budget:.1f}x {budget_text}; "
            f"recompute hidden states with the target during training"
        )
    return StorageEstimate(
        hidden_size=hidden_size,
        num_captured_layers=num_captured_layers,
        dtype=str(dtype),
        dtype_bytes=width,
        total_tokens=total_tokens,
        num_samples=num_samples,
        bytes_per_token=bytes_per_token,
        bytes_per_sample=total_bytes / num_samples,
        total_bytes=total_bytes,
        disk_bytes=disk_bytes,
        disk_assumed=disk_bytes is None,
        recommendation=recommendation,
        reason=reason,
    )


def read_model_shape(config_json_path: str | Path) -> tuple[int, int]:
    """(hidden_size, num_hidden_layers) from a Hugging Face `config.json` or a model directory.

    Multimodal configs keep the language model's shape under `text_config`; that is the one whose
    hidden states a drafter consumes.
    """
    path, config = read_model_config(config_json_path)
    for section in language_sections(config):
        hidden = section.get("hidden_size", section.get("n_embd", section.get("d_model")))
        layers = section.get("num_hidden_layers", section.get("n_layer", section.get("num_layers")))
        if isinstance(hidden, int) and isinstance(layers, int) and hidden > 0 and layers > 0:
            return hidden, layers
    raise InputError(f"{path}: no positive integer hidden_size and num_hidden_layers (also looked in text_config)")
