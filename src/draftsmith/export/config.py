"""The settings of `draftsmith export` (its CLI options come from this model)."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from draftsmith.core.config import StorageDType


class ExportConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    drafter: Path = Field(description="drafter directory, or a `draftsmith train` output directory")
    out: Path = Field(description="directory to write (config.json + model.safetensors + README.md)")
    dtype: StorageDType | None = Field(None, description="fp32, bf16 or fp16 (default: keep the checkpoint's)")
    force: bool = Field(False, description="replace a non-empty --out directory")
    check_reference: bool = Field(True, description="compare outputs with the reference dflash package")
    check_engines: bool = Field(True, description="ask each serving engine installed here whether it can serve this "
                                "drafter on its target family (printed, and written into the export's README)")
