"""`draftsmith audit`'s configuration (the CLI is generated from it)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from draftsmith.core.config import SequenceTokens, cli


class AuditConfig(BaseModel):
    """What `draftsmith audit` checks: the inputs, how to read them, and the gates' overrides."""

    model_config = ConfigDict(extra="forbid")

    paths: Annotated[list[Path], cli(positional=True)] = Field(
        description="conversation files (JSONL/Parquet) or tokenized datasets"
    )
    tokenizer: str | None = Field(None, description="tokenizer dir: decodes spans, checks end-of-turn, headers, thinking")
    kind: Literal["auto", "tokenized", "conversations"] = Field(
        "auto", description="what the inputs hold; auto: a tokenize output directory or input_ids columns are tokenized"
    )
    split: str | None = Field(None, description="DatasetDict split to audit (default: train, else the only one)")
    allow_partial: bool = Field(
        False, description="use an input whose writer (generate, tokenize) is still running, as it is now; said on stderr"
    )
    plot: Path | None = Field(None, description="write a PNG histogram of trainable tokens per sample")
    max_context: SequenceTokens | None = Field(None, description="context limit in tokens")
    threshold: Annotated[list[str], cli(split=False)] = Field(
        default_factory=list, description="override gates: name=value (share like 0.05 or 5%, or 'none'), comma-separated or repeated"
    )
