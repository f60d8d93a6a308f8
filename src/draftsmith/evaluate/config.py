"""The settings of `draftsmith eval` (its CLI options come from this model)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from draftsmith.core.config import StorageDType, cli


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target: Path = Field(description="target model directory (Hugging Face format, with tokenizer)")
    drafter: Path = Field(description="drafter checkpoint directory (config.json + model.safetensors)")
    prompts: Path = Field(description="prompts: JSONL/JSON/Parquet rows with messages, conversations or prompt")
    max_new_tokens: int = Field(256, ge=1, description="tokens to generate per prompt")
    limit: int | None = Field(None, ge=1, description="evaluate only the first N prompts")
    block_size: int | None = Field(None, ge=2, description="draft block size (default: the drafter's)")
    thinking: bool | None = Field(None, description="pass enable_thinking to the chat template")
    dtype: StorageDType = Field("float32", description="dtype of target and drafter: fp32 or bf16")
    out: Path | None = Field(None, description="also write the JSON report to this file")
    threads: int | None = Field(None, ge=1, description="torch CPU threads (1 is fastest for tiny models on busy machines)")
    plot: Annotated[Path | None, cli(metavar="FILE.png")] = Field(
        None, description="also draw the acceptance-length histogram and per-position acceptance to this PNG"
    )

    @field_validator("plot")
    @classmethod
    def _png(cls, value: Path | None) -> Path | None:
        if value is not None and value.suffix.lower() != ".png":
            raise ValueError(f"{value}: the plot is a PNG; give a file name ending in .png")
        return value
