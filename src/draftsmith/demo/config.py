"""The demo's settings and result."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

# The question that motivated draftsmith (README "Why"): 914,000 samples of about 2,500 output tokens.
SEED_SAMPLES = 914_000
SEED_OUTPUT_TOKENS = 2_500


class DemoConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workdir: Path = Field(Path("runs/demo"), description="Where every stage writes its output (replaced).")
    target: str = Field("tiny", description="tiny (built locally) or a real model `draftsmith models fetch` knows: "
                        "smollm2-135m (fetched once, then cached).")
    train_prompts: int = Field(320, ge=8, description="Prompts to regenerate and train on.")
    eval_prompts: int = Field(12, ge=1, description="Held-out prompts for speculative decoding.")
    max_tokens: int = Field(192, ge=1, description="Output tokens per regenerated sample.")
    concurrency: int = Field(16, ge=1, description="Requests in flight while regenerating.")
    # The recipe measured on the tiny target: about 2-3 CPU minutes of training for tau ~3.
    block_size: int = Field(16, ge=2, description="Drafter block size.")
    draft_layers: int = Field(1, ge=1, description="Drafter layers.")
    train_steps: int = Field(240, ge=1, description="Drafter optimizer steps.")
    batch_size: int = Field(4, ge=1, description="Training batch size.")
    lr: float = Field(5e-3, gt=0, description="Learning rate.")
    eval_max_new_tokens: int = Field(128, ge=1, description="Tokens decoded per held-out prompt.")
    threads: int | None = Field(None, ge=1, description="torch CPU threads (default: torch's choice).")
    seed: int = Field(0, description="Seed of the prompts, the training and the untrained drafter.")

    @field_validator("target")
    @classmethod
    def _known_target(cls, value: str) -> str:
        from draftsmith.models.registry import KNOWN_MODELS

        if value != "tiny" and value not in KNOWN_MODELS:
            raise ValueError(f"unknown target {value!r}; known: tiny, {', '.join(sorted(KNOWN_MODELS))}")
        return value


@dataclass
class DemoResult:
    target_dir: str
    rows_file: str
    tokenized_dir: str
    drafter_dir: str
    export_dir: str
    generated: int
    generate_tokens_per_s: float
    audit_verdict: str
    plan_days_for_914k: float
    """Days to regenerate the seed's 914k samples x 2,500 output tokens at the measured per-GPU rate."""
    train_first_loss: float
    train_final_loss: float
    train_steps: int
    train_seconds: float
    tau_trained: float
    tau_untrained: float
    speedup_trained: float
    lossless: bool
    stage_seconds: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
