"""Settings of the gates composed above the stages.

The overfit gate runs train, export and evaluate, so it cannot live in the check stage (a stage
never imports another stage); `check --overfit` reaches it through the CLI's stage hook, and the
user-facing options stay on `CheckConfig` (`--overfit-samples`, `--overfit-steps`, ...).
`OverfitConfig.from_check` is the one place they are read.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from draftsmith.core.config import SequenceTokens, Threads


class OverfitConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target: Path = Field(description="target model directory")
    export: Path | None = Field(None, description="export whose shape (block size, layers, layer ids, mask token) the gate copies")
    work: Path = Field(description="working directory (train run, export, overfit.json)")
    endpoint: str | None = Field(None, description="vLLM server serving <work>/export with the target")
    train: bool = Field(True, description="train the gate's drafter; False: judge the export's own weights")
    samples: int = Field(160, ge=1, description="training prompts (the target's own greedy answers)")
    # Measured on the tiny target: 240 steps made the drafter lean less on the target's features
    # (the shifted layer ids moved 10% of the accepted tokens, against 21% after 120 steps).
    steps: int = Field(120, ge=1, description="optimizer steps of the gate's training")
    eval_prompts: int = Field(24, ge=1, description="held-out prompts decoded in process and by the engine")
    max_new_tokens: SequenceTokens = Field(64, ge=8, description="tokens the target generates for each prompt")
    threads: Threads | None = Field(None, description="torch CPU threads of its training and decoding (default: from "
                                    "the machine's load, printed)")
    tolerance: float = Field(
        0.05, gt=0, description="largest share of accepted draft tokens on which engine and in-process may disagree"
    )
    min_margin: float = Field(
        3.0, gt=1, description="each planted fault must move the in-process disagreement to this many times the tolerance"
    )

    @classmethod
    def from_check(cls, config) -> "OverfitConfig":
        return cls(target=config.target, export=config.export, work=Path(config.overfit_dir or f"{config.export}.overfit"),
                   endpoint=config.endpoint, samples=config.overfit_samples, steps=config.overfit_steps,
                   max_new_tokens=config.overfit_max_new_tokens, train=config.overfit_train,
                   threads=config.threads)  # fmt: skip


TOLERANCE = OverfitConfig.model_fields["tolerance"].default
MIN_MARGIN = OverfitConfig.model_fields["min_margin"].default
