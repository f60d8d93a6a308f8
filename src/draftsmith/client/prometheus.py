"""Reading an engine's Prometheus `/metrics` text: samples with their labels, and vLLM's speculative
decoding counters per draft position.

vLLM (vllm/v1/spec_decode/metrics.py) counts, over the server's life, verify steps
(`vllm:spec_decode_num_drafts`), drafted and accepted tokens, and per draft position k (label
`position`, 0-based) the steps that accepted it (`vllm:spec_decode_num_accepted_tokens_per_pos`).
Counters carry the `_total` suffix in the exposition; both spellings are read. Position k's share
of the steps is the per-position acceptance profile; it never rises with k, since a draft token
counts only when every earlier one was accepted too.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from draftsmith.core.errors import InputError

_SAMPLE = re.compile(r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)")
_LABEL = re.compile(r'(?P<key>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')

VLLM_DRAFTS = "vllm:spec_decode_num_drafts"
VLLM_ACCEPTED_PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"

Samples = dict[str, list[tuple[dict[str, str], float]]]


def parse_samples(text: str) -> Samples:
    """Prometheus text exposition -> {metric name: [(labels, value), ...]}; comments, unparsable and
    non-finite samples skipped."""
    samples: Samples = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        match = _SAMPLE.match(line)
        if not match:
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        if math.isfinite(value):
            labels = {key: value for key, value in _LABEL.findall(match["labels"] or "")}
            samples.setdefault(match["name"], []).append((labels, value))
    return samples


def _counter(samples: Samples, name: str) -> list[tuple[dict[str, str], float]] | None:
    for spelling in (name + "_total", name):
        if spelling in samples:
            return samples[spelling]
    return None


@dataclass
class PositionCounts:
    """Verify steps and, per draft position (index 0 = position 1), the steps that accepted it."""

    drafts: float = 0.0
    accepted_per_position: list[float] = field(default_factory=list)

    def __sub__(self, earlier: PositionCounts) -> PositionCounts:
        width = max(len(self.accepted_per_position), len(earlier.accepted_per_position))
        mine = self.accepted_per_position + [0.0] * (width - len(self.accepted_per_position))
        theirs = earlier.accepted_per_position + [0.0] * (width - len(earlier.accepted_per_position))
        return PositionCounts(self.drafts - earlier.drafts, [a - b for a, b in zip(mine, theirs)])

    def profile(self) -> list[float]:
        """Share of verify steps that accepted each draft position (empty without steps)."""
        return [count / self.drafts for count in self.accepted_per_position] if self.drafts > 0 else []


def vllm_position_counts(samples: Samples, max_positions: int | None = None) -> PositionCounts | None:
    """vLLM's per-position counters summed over engines and label sets; None when it does not speculate.
    With ``max_positions``, a position label at or past it is an `InputError` (a list as long as the
    largest label is built: ``position="99999999"`` would take gigabytes)."""
    drafts = _counter(samples, VLLM_DRAFTS)
    if drafts is None:
        return None
    per_position: dict[int, float] = {}
    for labels, value in _counter(samples, VLLM_ACCEPTED_PER_POSITION) or []:
        position = labels.get("position")
        if position is not None and position.isdigit():
            if max_positions is not None and (len(position) > 9 or int(position) >= max_positions):
                raise InputError(f"{VLLM_ACCEPTED_PER_POSITION} names position {position[:12]}"
                                 f"{'...' if len(position) > 12 else ''}; no draft block has more than {max_positions} "
                                 f"positions (0..{max_positions - 1})")
            per_position[int(position)] = per_position.get(int(position), 0.0) + value
    width = max(per_position) + 1 if per_position else 0
    return PositionCounts(sum(value for _, value in drafts), [per_position.get(k, 0.0) for k in range(width)])
