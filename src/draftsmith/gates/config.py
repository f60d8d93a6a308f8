"""Settings of the gates composed above the stages.

The overfit gate runs train, export and evaluate, so it cannot live in the check stage (a stage
never imports another stage); `check --overfit` reaches it through the CLI's stage hook, and the
user-facing options stay on `CheckConfig` (`--overfit-samples`, `--overfit-steps`, ...).
`OverfitConfig.from_check` is the one place they are read.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field


class OverfitConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target: Path = Field(description="target model directory")
    export: Path | None = Field(None, description="export whose shape (block size, layers, layer ids, mask token) the gate copies")
    work: Path = Field(description="working directory (train run, export, overfit.json)")
    endpoint: str | None = Field(None, description="vLLM server serving <work>/export with the target")
    samples: int = Field(1, ge=1, description="samples the drafter overfits")
    steps: int = Field(200, ge=1, description="optimizer steps of the overfit training")
    max_new_tokens: int = Field(64, ge=8, description="tokens the target generates for each sample")
    tolerance: float = Field(0.10, gt=0, description="engine tau must be within this fraction of the in-process tau")
    min_fraction: float = Field(
        0.5, gt=0, le=1, description="in-process tau must reach this fraction of the block size (the drafter really overfit)"
    )

    @classmethod
    def from_check(cls, config) -> "OverfitConfig":
        return cls(target=config.target, export=config.export, work=Path(config.overfit_dir or f"{config.export}.overfit"),
                   endpoint=config.endpoint, samples=config.overfit_samples, steps=config.overfit_steps,
                   max_new_tokens=config.overfit_max_new_tokens)  # fmt: skip


TOLERANCE = OverfitConfig.model_fields["tolerance"].default
MIN_FRACTION = OverfitConfig.model_fields["min_fraction"].default
