"""The settings of `draftsmith status` and what it reports (one `StatusSummary` per call)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from draftsmith.core.config import cli

State = Literal["pending", "running", "finished", "stalled", "dead", "failing"]
#: States that need a person: exit code 1 (cron and alerting key on it).
ALERT_STATES = frozenset({"stalled", "dead", "failing"})
#: The worst state of several shards wins, in this order.
STATE_ORDER = ("finished", "pending", "running", "failing", "stalled", "dead")


class StatusConfig(BaseModel):
    """What to look at and how to judge it; status reads the directories and writes nothing."""

    model_config = ConfigDict(extra="forbid")

    dirs: Annotated[list[Path], cli(positional=True)] = Field(
        description="output directories of one stage (several: the shards of several nodes, aggregated)"
    )
    window: str = Field("10m", description="recent window for rates and the ETA (e.g. 10m, 1h)")
    stall_after: str = Field("10m", description="a live writer with no new row (or step) for this long is stalled")
    planned_tokens: float | None = Field(
        None, gt=0, description="the planned mean output tokens per sample (from `draftsmith plan`): the ETA is re-planned against it"
    )
    failing_share: float = Field(
        0.5, ge=0, le=1, description="failing: at least this share of the window's finished samples failed (and 5 or more)"
    )


class ShardStatus(BaseModel):
    """One shard (generate) or one directory (other stages)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    directory: str
    state: State
    done: int | None = None
    total: int | None = None
    failed: int = 0
    rows_per_s: float | None = None
    output_tokens_per_s: float | None = None
    writer: str = "none"
    writer_alive: bool | None = None
    last_write_age_s: float | None = None
    note: str | None = None


class StatusSummary(BaseModel):
    """The view of a stage's output: the `--json` object and the rendered screen."""

    model_config = ConfigDict(extra="forbid")

    stage: str
    state: State
    directories: list[str]
    done: int | None = None
    total: int | None = None
    total_estimated: bool = False
    rows_per_s: float | None = None
    rows_per_s_since_start: float | None = None
    output_tokens_per_s: float | None = None
    output_tokens_per_s_since_start: float | None = None
    eta_s: float | None = None
    finishes_at: float | None = Field(None, description="unix time the job finishes at the window rate")
    writer_alive: bool | None = None
    last_write_age_s: float | None = None
    failures: dict[str, int] = Field(default_factory=dict, description="failed samples by kind")
    failed: int = 0
    settings: dict[str, Any] = Field(default_factory=dict)
    lengths: dict[str, Any] = Field(default_factory=dict, description="output-length distribution so far")
    replan: dict[str, Any] | None = None
    disk: dict[str, Any] | None = None
    train: dict[str, Any] | None = None
    curve: dict[str, Any] | None = Field(None, description="plan data: the curve's runs measured of all, its fit method")
    alerts: list[str] = Field(default_factory=list)
    shards: list[ShardStatus] = Field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return 1 if self.state in ALERT_STATES else 0

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")


def worst_state(states: list[str]) -> str:
    return max(states, key=STATE_ORDER.index) if states else "dead"
