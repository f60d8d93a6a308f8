"""`draftsmith bench` settings."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from draftsmith.core.config import SequenceTokens, cli

DEFAULT_CONCURRENCIES = (1, 8, 16, 32, 48, 64)


class BenchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    prompts: Annotated[list[str | Path] | str | Path, cli(positional=True)] = Field(
        description="Prompt files/dirs (as for generate): real prompts, real lengths.")
    endpoint: Annotated[str, cli("--endpoint", "-e")] = Field(
        "http://127.0.0.1:8000", description="ONE endpoint (= one GPU/server).")
    concurrencies: Annotated[tuple[Annotated[int, Field(ge=1)], ...], cli("--concurrency")] = Field(
        DEFAULT_CONCURRENCIES, min_length=1, description="Concurrency levels to sweep.")
    requests_per_level: Annotated[int | None, cli("--requests")] = Field(
        None, ge=1, description="Requests measured per level; default max(min_requests, 4 * concurrency).")
    min_requests: int = Field(16, ge=1, description="Fewest requests measured per level.")
    max_tokens: SequenceTokens = Field(2048, description="max_tokens of every request.")
    temperature: float | None = Field(0.6, ge=0, description="Sampling temperature (none: the server's default).")
    top_p: float | None = Field(0.95, gt=0, le=1, description="Nucleus sampling top_p (none: the server's default).")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Extra chat_template_kwargs (JSON object or KEY=VALUE); --thinking sets enable_thinking "
        "(default: what the target's chat template supports, see --target).")
    target: Path | None = Field(
        None, description="Target model or tokenizer dir: its chat template decides the default thinking mode "
        "(default: the endpoint's /props template, which llama-server serves; else thinking on).")
    extra_body: dict[str, Any] = Field(default_factory=dict, description="Extra fields of every request body.")
    stream: bool = Field(True, description="Stream (needed for TTFT).")
    split: str | None = Field(None, description="DatasetDict split of the prompts (default: train, else the only one).")
    model: str | None = Field(None, description="Model name (default: from /v1/models).")
    engine: str | None = Field(
        None, description="Engine name for the JSON; default: the owned_by of /v1/models (vllm, llamacpp, sglang...).")
    warmup: bool = Field(True, description="An unmeasured warm-up of `concurrency` requests before each level.")
    knee_tolerance: float = Field(0.1, ge=0, le=1, description="Knee: the first level within this share of the best throughput.")
    timeout_s: Annotated[float, cli("--timeout")] = Field(1800.0, gt=0, description="Seconds one request may take.")
    seed: int = Field(0, description="Seed of the prompt order.")
    metrics: bool = Field(True, description="Record the engine's running batch, cache usage and acceptance from /metrics.")
    metrics_interval_s: Annotated[float, cli("--metrics-interval")] = Field(
        0.25, gt=0, description="Seconds between /metrics polls during a level.")
    api_key: Annotated[str | None, cli(envvar="OPENAI_API_KEY")] = Field(
        None, description="API key sent as a Bearer token (or OPENAI_API_KEY).")
