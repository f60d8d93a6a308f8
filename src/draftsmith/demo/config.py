"""The demo's settings and result."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from draftsmith.core.config import BlockSize, SequenceTokens, Threads

# The question that motivated draftsmith (README "Why"): 914,000 samples of about 2,500 output tokens.
SEED_SAMPLES = 914_000
SEED_OUTPUT_TOKENS = 2_500

# A real target computes ~100x more per token than the tiny one: the demo on it keeps to a few CPU
# minutes per stage with fewer, shorter samples, block 8 (the offsets a briefly trained drafter
# gets right are the first few) and bf16 training where the CPU multiplies bf16 natively. Any
# of these given explicitly wins.
REAL_TARGET_DEFAULTS: dict[str, Any] = {
    "train_prompts": 64, "eval_prompts": 4, "max_tokens": 128, "concurrency": 16, "block_size": 8,
    "draft_layers": 1, "train_steps": 150, "batch_size": 1, "lr": 6e-4, "eval_max_new_tokens": 64,
}  # fmt: skip


class DemoConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    workdir: Path = Field(Path("runs/demo"), description="Where every stage writes its output (replaced).")
    target: str = Field("tiny", description="tiny (built locally) or a real model `draftsmith models fetch` knows: "
                        "smollm2-135m (fetched once, then cached). A real target's unset sizes are REAL_TARGET_DEFAULTS: "
                        "64 prompts x 128 tokens, 150 steps of a 1-layer block-8 drafter, 4 x 64 eval tokens.")
    train_prompts: int = Field(320, ge=8, description="Prompts to regenerate and train on.")
    eval_prompts: int = Field(12, ge=1, description="Held-out prompts for speculative decoding.")
    max_tokens: SequenceTokens = Field(192, description="Output tokens per regenerated sample.")
    concurrency: int = Field(16, ge=1, description="Requests in flight while regenerating.")
    # The recipe measured on the tiny target: about 2-3 CPU minutes of training for tau ~3.
    block_size: BlockSize = Field(16, description="Drafter block size.")
    draft_layers: int = Field(1, ge=1, description="Drafter layers.")
    train_steps: int = Field(240, ge=1, description="Drafter optimizer steps.")
    batch_size: int = Field(4, ge=1, description="Training batch size.")
    lr: float = Field(5e-3, gt=0, description="Learning rate.")
    eval_max_new_tokens: SequenceTokens = Field(128, description="Tokens decoded per held-out prompt.")
    train_dtype: Literal["auto", "fp32", "bf16"] = Field(
        "auto", description="Training compute dtype: auto is fp32 for the tiny target; for a real one bf16 where "
        "the CPU multiplies bf16 natively (AMX, AVX512-BF16) or on CUDA, else fp32.")
    threads: Threads | None = Field(None, description="Torch CPU threads (default: one per CPU the machine's 1-minute load leaves idle, printed; at most 4 per CPU).")
    seed: int = Field(0, description="Seed of the prompts, the training and the untrained drafter.")

    @field_validator("target")
    @classmethod
    def _known_target(cls, value: str) -> str:
        from draftsmith.models.registry import KNOWN_MODELS

        if value != "tiny" and value not in KNOWN_MODELS:
            raise ValueError(f"unknown target {value!r}; known: tiny, {', '.join(sorted(KNOWN_MODELS))}")
        return value

    @model_validator(mode="after")
    def _real_target_sizes(self) -> "DemoConfig":
        """The defaults above are the tiny target's; a real one gets REAL_TARGET_DEFAULTS where unset."""
        if self.target != "tiny":
            for name, value in REAL_TARGET_DEFAULTS.items():
                if name not in self.model_fields_set:
                    object.__setattr__(self, name, value)
        return self

    def resolved_train_dtype(self, cuda: bool) -> str:
        """The compute dtype `train` gets: `train_dtype`, with auto resolved for this machine."""
        if self.train_dtype != "auto":
            return self.train_dtype
        if self.target == "tiny":
            return "fp32"
        from draftsmith.core.config import cpu_multiplies_bf16_natively

        return "bf16" if cuda or cpu_multiplies_bf16_natively() else "fp32"


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
