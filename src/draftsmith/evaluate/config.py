"""The settings of `draftsmith eval` (its CLI options come from this model).

Two modes: `target` + `drafter` runs real speculative decoding in this process; `endpoint`
measures a live engine already serving the target with the drafter (see evaluate/endpoint.py).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from draftsmith.core.config import BlockSize, SequenceTokens, StorageDType, Threads, cli


class EvalConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompts: Path = Field(description="prompts: JSONL/JSON/Parquet rows with messages, conversations or prompt")
    target: Path | None = Field(None, description="target model directory (Hugging Face format, with tokenizer)")
    drafter: Path | None = Field(None, description="drafter checkpoint directory (config.json + model.safetensors)")
    baseline: list[Literal["ngram", "untrained"]] = Field(
        [], description="also decode the same prompts with: ngram (prompt lookup), untrained (random drafter of the "
        "same config); comma-separated; without --drafter only these")
    ngram_max: Annotated[int, cli(metavar="N")] = Field(3, ge=1, description="--baseline ngram: longest n-gram matched")
    ngram_min: Annotated[int, cli(metavar="N")] = Field(1, ge=1, description="--baseline ngram: shortest n-gram matched")
    mask_token_id: int | None = Field(
        None, ge=0, description="--baseline untrained without --drafter: mask id of the random drafter (default: <|MASK|>)")
    endpoint: str | None = Field(
        None, description="measure a live engine (vLLM or SGLang) serving target + drafter at this URL instead")
    baseline_endpoint: str | None = Field(
        None, description="with --endpoint: the same target served without speculation (speed-up, identical output)")
    model: str | None = Field(None, description="with --endpoint: served model name (default: the first of /v1/models)")
    max_new_tokens: SequenceTokens = Field(256, description="tokens to generate per prompt")
    limit: int | None = Field(None, ge=1, description="evaluate only the first N prompts")
    split: str | None = Field(None, description="DatasetDict split of --prompts (default: train, else the only one)")
    block_size: BlockSize | None = Field(None, description="draft block size (default: the drafter's)")
    thinking: bool | None = Field(None, description="pass enable_thinking to the chat template")
    dtype: StorageDType = Field("float32", description="dtype of target and drafter: fp32, bf16 or fp16")
    device: Annotated[str, cli(metavar="DEVICE")] = Field(
        "auto", description="where target and drafter run: auto (cuda if present), cpu, cuda, cuda:N")
    tie_tolerance: Annotated[float | None, cli(metavar="LOGITS")] = Field(
        None, ge=0.0, allow_inf_nan=False,
        description="greedy: a difference where the target's top-2 logit margin is at most this is a reported "
        "near-tie, not a failure (default by dtype: fp32 0.001, fp16 0.125, bf16 0.5; 0 = exact)")
    temperature: float = Field(
        0.0, ge=0.0, allow_inf_nan=False, description="0: greedy, output must be token-identical; above 0: speculative sampling at this T")
    seed: int = Field(0, description="sampling seed (temperature above 0)")
    out: Path | None = Field(None, description="also write the JSON report to this file")
    threads: Threads | None = Field(
        None, description="torch CPU threads (default on CPU: one per CPU the machine's 1-minute load leaves "
        "idle, printed; every core runs far slower on a busy machine; at most 4 per CPU)")
    plot: Annotated[Path | None, cli(metavar="FILE.png")] = Field(
        None, description="also draw the acceptance-length histogram and per-position acceptance to this PNG"
    )

    @field_validator("device")
    @classmethod
    def _device(cls, value: str) -> str:
        value = value.strip().lower()
        if not re.fullmatch(r"auto|cpu|mps|(cuda|xpu)(:\d+)?", value):
            raise ValueError(f"must be auto, cpu, cuda, cuda:N, xpu or mps, got {value!r}")
        return value

    @field_validator("plot")
    @classmethod
    def _png(cls, value: Path | None) -> Path | None:
        if value is not None and value.suffix.lower() != ".png":
            raise ValueError(f"{value}: the plot is a PNG; give a file name ending in .png")
        return value

    @model_validator(mode="after")
    def _one_mode(self) -> EvalConfig:
        if self.endpoint is None and (self.target is None or (self.drafter is None and not self.baseline)):
            raise ValueError("give --target and --drafter and/or --baseline (in-process), or --endpoint (a live engine)")
        if self.endpoint is not None and (self.target is not None or self.drafter is not None or self.baseline):
            raise ValueError("--endpoint measures a live engine; leave out --target/--drafter/--baseline")
        if len(set(self.baseline)) != len(self.baseline):
            raise ValueError(f"--baseline names a method twice: {','.join(self.baseline)}")
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"--ngram-min {self.ngram_min} is above --ngram-max {self.ngram_max}")
        if self.baseline_endpoint is not None and self.endpoint is None:
            raise ValueError("--baseline-endpoint needs --endpoint")
        if self.endpoint is not None and self.plot is not None:
            raise ValueError("--plot draws the in-process eval's histogram; an --endpoint report has none")
        return self
