"""`draftsmith serve` settings: the server and its fault injection."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from draftsmith.core.config import cli

Share = Annotated[float, Field(ge=0, le=1)]


class FaultConfig(BaseModel):
    """Fault injection for tests of the client's retry / requeue / resume logic.

    Counters apply to ``/v1/chat/completions`` only. ``fail_rate`` and ``drop_rate`` are drawn from
    a RNG seeded by ``seed`` so runs are reproducible.
    """

    model_config = ConfigDict(extra="forbid")

    fail_rate: Annotated[Share, cli("--fail-rate")] = Field(
        0.0, description="Share of requests answered with fail_status (and a JSON error body).")
    fail_status: Annotated[int, cli("--fail-status")] = Field(
        503, description="HTTP status of injected failures (e.g. 503, 429, 400).")
    fail_first: Annotated[int, cli("--fail-first")] = Field(
        0, ge=0, description="The first N requests fail with fail_status (deterministic).")
    drop_rate: Annotated[Share, cli("--drop-rate")] = Field(
        0.0, description="Share of requests whose connection is closed without any response.")
    delay_s: Annotated[float, cli("--delay")] = Field(0.0, ge=0, description="Added latency (seconds) before every completion.")
    die_after: Annotated[int, cli("--die-after")] = Field(
        0, ge=0, description="Hard-exit the process (like a crashed engine) when this many requests have arrived (0: never).")
    retry_after: Annotated[str | None, cli("--retry-after")] = Field(
        None, description="Retry-After header of injected failures, sent as given (e.g. 1e12, inf); default: 0 on a 429.")
    cut_stream_rate: Annotated[Share, cli("--cut-stream-rate")] = Field(
        0.0, description="Share of streamed answers that end cleanly halfway, before their finish_reason chunk and [DONE].")
    bad_content_rate: Annotated[Share, cli("--bad-content-rate")] = Field(
        0.0, description="Share of non-streamed answers whose message is replaced by bad_content (and no reasoning).")
    bad_content: Annotated[Literal["null", "number"], cli("--bad-content")] = Field(
        "null", description="What a bad answer's content is: null or a number.")
    unhealthy: Annotated[bool, cli("--unhealthy/--no-unhealthy")] = Field(
        False, description="/health answers 503 (an endpoint that is up but not ready).")
    seed: Annotated[int, cli("--seed")] = Field(0, description="Seed of the fault-injection RNG.")


class ServeConfig(BaseModel):
    """Settings of one `draftsmith serve` process."""

    model_config = ConfigDict(extra="forbid")

    backend: Literal["model", "echo"] | None = Field(
        None, description="model (Hugging Face causal LM from --model) or echo; default: model with --model, else echo.")
    model_dir: Annotated[Path | None, cli("--model")] = Field(None, description="Hugging Face model directory (the 'model' backend).")
    served_model_name: str | None = Field(None, description="Model name reported by the API.")
    host: str = Field("127.0.0.1", description="Address to listen on.")
    port: int = Field(8000, ge=0, le=65535, description="Port (0: pick a free one; the bound port is printed).")
    reasoning_field: Literal["reasoning_content", "reasoning", "inline"] = Field(
        "reasoning_content", description="reasoning_content (SGLang/llama-server), reasoning (vLLM) or inline (<think> in content).")
    max_batch_size: int = Field(16, ge=1, description="Most concurrent requests decoded in one batch.")
    batch_wait_s: Annotated[float, cli(hidden=True)] = Field(
        0.005, ge=0, description="How long the batcher waits for more requests to join a batch that is not yet full.")
    echo_answer: str = Field("The answer to {prompt}", description="Echo backend answer template; {prompt} is the last user message.")
    echo_reasoning: str = Field("Let me think about {prompt}", description="Echo backend reasoning template (empty: no reasoning).")
    faults: FaultConfig = Field(default_factory=FaultConfig, description="Fault injection.")

    @model_validator(mode="after")
    def _default_backend(self) -> ServeConfig:
        if self.backend is None:
            object.__setattr__(self, "backend", "model" if self.model_dir is not None else "echo")
        return self

    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        if self.backend == "model" and self.model_dir is not None:
            return Path(self.model_dir).name
        return "echo"
