"""`EvalConfig`: what `draftsmith eval` measures, in-process (target + drafter) or on a live engine."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator


class EvalConfig(BaseModel):
    """Either `target` + `drafter` (real speculative decoding in this process) or `endpoint`."""

    model_config = ConfigDict(extra="forbid")

    prompts: Path = Field(..., description="Prompts: JSONL/JSON/Parquet rows with messages, conversations or prompt.")
    target: Path | None = Field(None, description="Target model directory (Hugging Face format, with tokenizer).")
    drafter: Path | None = Field(None, description="Drafter checkpoint directory (config.json + model.safetensors).")
    endpoint: str | None = Field(
        None, description="Measure a live engine serving target + drafter at this URL (vLLM or SGLang) instead.")
    baseline_endpoint: str | None = Field(
        None, description="With --endpoint: the same target served without speculation, for speed-up and identity.")
    model: str | None = Field(None, description="With --endpoint: served model name (default: the first of /v1/models).")
    max_new_tokens: int = Field(256, ge=1, description="Tokens to generate per prompt.")
    limit: int | None = Field(None, ge=1, description="Evaluate only the first N prompts.")
    block_size: int | None = Field(None, ge=2, description="Draft block size (default: the drafter's).")
    thinking: bool | None = Field(None, description="Pass enable_thinking to the chat template.")
    dtype: str = Field("float32", description="float32 or bfloat16 for target and drafter.")
    temperature: float = Field(
        0.0, ge=0.0, description="0 = greedy (checks token identity); above 0 = speculative sampling at this T.")
    seed: int = Field(0, description="Sampling seed (temperature > 0).")
    threads: int | None = Field(None, ge=1, description="torch CPU threads (1 is fastest for tiny models on busy machines).")

    @model_validator(mode="after")
    def _one_mode(self) -> EvalConfig:
        if self.endpoint is None and (self.target is None or self.drafter is None):
            raise ValueError("give --target and --drafter (in-process), or --endpoint (a live engine)")
        if self.endpoint is not None and (self.target is not None or self.drafter is not None):
            raise ValueError("--endpoint measures a live engine; leave out --target/--drafter")
        if self.baseline_endpoint is not None and self.endpoint is None:
            raise ValueError("--baseline-endpoint needs --endpoint")
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(f"--dtype must be one of ['bfloat16', 'float32'], got {self.dtype!r}")
        return self
