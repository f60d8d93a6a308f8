"""The settings of `draftsmith generate` (the CLI options come from these) and its summary.

Kept free of aiohttp and torch so that building the command line stays fast.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from draftsmith.core.config import SequenceTokens, cli
from draftsmith.core.errors import InputError

ORDERS = ("input", "longest-first", "prefix")
Share = Annotated[float, Field(ge=0, le=1)]


class GuardConfig(BaseModel):
    """Quality-guard thresholds: shares in [0, 1]; a threshold of 1.0 (or ``enabled=False``) disables a check."""

    model_config = ConfigDict(extra="forbid")

    enabled: Annotated[bool, cli("--guard/--no-guard")] = Field(True, description="run the quality guard")
    window: int = Field(200, ge=1, description="recent completions the shares are computed over")
    min_samples: int = Field(50, ge=1, description="completions seen before the guard may stop the run")
    max_empty_answer: Annotated[Share, cli("--max-empty-answer")] = Field(0.2, description="stop above this share of empty answers")
    max_empty_reasoning: Annotated[Share, cli("--max-empty-reasoning")] = Field(
        0.5, description="stop above this share of completions without reasoning (thinking on)"
    )
    max_boilerplate: Annotated[Share, cli("--max-boilerplate")] = Field(
        0.5, description="stop above this share of one identical answer"
    )
    max_length_finish: Annotated[Share, cli("--max-length-finish")] = Field(
        0.3, description="stop above this share of finish_reason 'length'"
    )
    warn_length_finish: Annotated[Share, cli("--warn-length-finish")] = Field(
        0.05, description="warn (once, as the run goes) above this share of finish_reason 'length'"
    )
    expect_reasoning: Annotated[bool, cli(hidden=True)] = Field(
        True, description="False when thinking is disabled: empty reasoning is then expected"
    )


class GenerateConfig(BaseModel):
    """Everything a generation run needs. Paths may be str or Path."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    cli_panels: ClassVar[dict[str, tuple[str, ...]]] = {
        "Sampling": ("model", "target", "max_tokens", "temperature", "top_p", "seed", "chat_template_kwargs", "extra_body",
                     "return_token_ids"),  # fmt: skip
        "Endpoints and retries": ("endpoints", "api_key", "concurrency", "stream", "max_retries", "backoff_base_s",
                                  "backoff_max_s", "request_timeout_s", "health_interval_s", "health_timeout_s",
                                  "endpoint_wait_s"),  # fmt: skip
        "Quality guard": ("guard",),
    }

    inputs: Annotated[list[str | Path] | str | Path, cli(positional=True)] = Field(
        description="prompt files or dirs: anything `draftsmith.data.sources` opens, any row format it reads"
    )
    output_dir: Annotated[str | Path, cli("--output", "-o")] = Field(
        description="output directory (append-only shards; resumable)"
    )
    endpoints: Annotated[list[str], cli("--endpoint", "-e")] = Field(
        default_factory=lambda: ["http://127.0.0.1:8000"],
        description="base URLs of OpenAI-compatible servers (http://host:port or .../v1), one per GPU/node",
    )
    model: str | None = Field(None, description="model name sent with each request (default: the endpoint's first /v1/models id)")
    max_tokens: SequenceTokens = Field(4096, description="cap on output tokens per completion")
    temperature: float | None = Field(0.6, description="sampling temperature (>= 0)")
    top_p: float | None = Field(0.95, description="nucleus sampling (0, 1]")
    seed: int | None = Field(None, description="sampling seed sent to the engine")
    chat_template_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="extra chat_template_kwargs (JSON object or KEY=VALUE); --thinking sets enable_thinking "
        "(default: what the target's chat template supports, see --target)",
    )
    target: Path | None = Field(
        None, description="the target model or tokenizer directory: its chat template decides the default thinking "
        "mode (default: the endpoint's /props template, which llama-server serves; else thinking on)",
    )
    extra_body: dict[str, Any] = Field(
        default_factory=dict, description='extra request fields passed through as they are (e.g. {"top_k": 20})'
    )
    concurrency: int | None = Field(
        None, ge=1,
        description="most requests in flight per endpoint (default: what the engine runs at once: llama-server's "
        "slots from /props, vLLM's max_num_seqs; 32 where it does not say)",
    )  # fmt: skip
    stream: bool = Field(False, description="stream responses (SSE)")
    return_token_ids: Annotated[bool, cli("--token-ids/--no-token-ids")] = Field(
        True, description="ask for prompt/completion token ids (vLLM return_token_ids); engines that ignore it are fine"
    )
    shard_index: Annotated[int, cli(hidden=True)] = Field(0, ge=0)
    shard_count: Annotated[int, cli(hidden=True)] = Field(1, ge=1)
    order: Literal["input", "longest-first", "prefix"] = Field(
        "input",
        description="input, longest-first (long prompts start early, shorter tail) or prefix (shared prefixes "
        "adjacent, for prefix caching)",
    )
    limit: int | None = Field(None, ge=1, description="attempt at most this many samples this run (the rest remain)")
    retry_failed: Annotated[bool, cli("--retry-failed/--skip-failed")] = Field(
        True, description="retry samples an earlier run listed as failed (off: count them as skipped)"
    )
    max_retries: int = Field(5, ge=0, description="retries per sample for 408/429/5xx/timeouts; connection errors get twice as many")
    backoff_base_s: float = Field(0.5, ge=0, description="first retry delay in seconds, doubled per retry")
    backoff_max_s: float = Field(30.0, ge=0, description="longest retry delay in seconds (a server's Retry-After included)")
    request_timeout_s: Annotated[float, cli("--timeout")] = Field(1800.0, gt=0, description="per-request timeout in seconds")
    health_interval_s: Annotated[float, cli("--health-interval")] = Field(
        10.0, gt=0, description="seconds between endpoint health checks"
    )
    health_timeout_s: float = Field(
        30.0, gt=0,
        description="a /health check unanswered within this counts as unanswered; two in a row with nothing else "
        "from the endpoint for this long (and for twice its longest request) make it hung: its stalled requests "
        "are cancelled and requeued on the others (a busy engine answering slowly is alive)",
    )  # fmt: skip
    endpoint_wait_s: Annotated[float, cli("--endpoint-wait")] = Field(
        600.0, ge=0, description="how long to wait while no endpoint is healthy (at start or mid-run) before stopping"
    )
    guard: GuardConfig = Field(default_factory=GuardConfig, description="quality guard")
    progress: bool = Field(True, description="show a progress bar with rate and ETA")
    api_key: Annotated[str | None, cli(envvar="OPENAI_API_KEY")] = Field(None, description="bearer token, if the engine needs one")
    fsync_interval_s: float = Field(1.0, ge=0, description="seconds between fsyncs of the output shard")
    force_resume: bool = Field(
        False, description="resume into an output written with other settings (model, sampling, template kwargs, max tokens)"
    )
    split: str | None = Field(None, description="the DatasetDict split to read (default: train, else the only one)")

    def output_settings(self, model: str) -> dict[str, Any]:
        """What shapes the rows: a resume with other values would mix two datasets in one directory."""
        return {"model": model, "shard_count": self.shard_count, "max_tokens": self.max_tokens,
                "temperature": self.temperature, "top_p": self.top_p, "seed": self.seed,
                "chat_template_kwargs": self.chat_template_kwargs, "extra_body": self.extra_body}  # fmt: skip

    def check_run(self) -> None:
        """What pydantic cannot say field by field (the CLI sets the shard after building the config)."""
        if not self.endpoints:
            raise InputError("at least one endpoint is needed (--endpoint URL)")
        if not (0 <= self.shard_index < self.shard_count):
            raise InputError(f"shard {self.shard_index}/{self.shard_count}: need 0 <= i < N")


@dataclass
class GenerateSummary:
    """The accounting of one run for one shard. ``ok`` when everything is accounted for and done."""

    input: int  # prompt rows in this shard (duplicates included)
    done: int
    failed: int
    skipped: int  # already_done + duplicates + skipped_failed
    remaining: int  # not finished this run (stopped, interrupted or beyond `limit`); a rerun resumes them
    already_done: int = 0
    duplicates: int = 0
    skipped_failed: int = 0
    retries: int = 0
    requeued: int = 0
    output_tokens: int = 0
    elapsed_s: float = 0.0
    output_tokens_per_s: float = 0.0
    stopped_reason: str | None = None
    guard_tripped: bool = False
    output_dir: str = ""
    rows_file: str | None = None
    failures_file: str | None = None
    model: str | None = None
    endpoints: list[dict[str, Any]] = field(default_factory=list)
    length_finished: int = 0  # rows of this run cut off at max_tokens (finish_reason 'length')
    on_disk: int | None = None  # this shard's samples found in the output directory after the run (rescanned)
    duplicates_on_disk: int | None = None  # rows beyond the first for any id of this shard (must be 0)

    @property
    def accounted(self) -> bool:
        counts_match = self.done + self.failed + self.skipped + self.remaining == self.input
        disk_match = self.on_disk is None or self.on_disk == self.already_done + self.done
        return counts_match and disk_match and not self.duplicates_on_disk

    @property
    def ok(self) -> bool:
        return self.accounted and self.failed == 0 and self.remaining == 0 and self.stopped_reason is None

    def problems(self) -> list[str]:
        issues = []
        if self.done + self.failed + self.skipped + self.remaining != self.input:
            issues.append(
                f"accounting mismatch: done {self.done} + failed {self.failed} + skipped {self.skipped} + "
                f"remaining {self.remaining} != input {self.input}"
            )
        if self.on_disk is not None and self.on_disk != self.already_done + self.done:
            issues.append(f"the output holds {self.on_disk} of this shard's samples, expected "
                          f"{self.already_done + self.done} (already done + done)")  # fmt: skip
        if self.duplicates_on_disk:
            issues.append(f"{self.duplicates_on_disk} duplicate rows in the output")
        if self.stopped_reason:
            issues.append(self.stopped_reason)
        if self.failed:
            issues.append(f"{self.failed} samples failed (see {self.failures_file})")
        if self.remaining and not self.stopped_reason:
            issues.append(f"{self.remaining} samples remain (rerun to resume)")
        return issues

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["accounted"] = self.accounted
        data["ok"] = self.ok
        return data

    def render(self, console) -> None:
        from rich.table import Table

        table = Table(title="draftsmith generate", show_header=False)
        table.add_row("input (this shard)", f"{self.input:,}")
        table.add_row("done", f"{self.done:,}")
        table.add_row("failed", f"{self.failed:,}")
        table.add_row(
            "skipped",
            f"{self.skipped:,} (already done {self.already_done:,}, duplicates {self.duplicates:,}, "
            f"earlier failures {self.skipped_failed:,})",
        )
        table.add_row("remaining", f"{self.remaining:,}")
        table.add_row("done+failed+skipped+remaining = input", "OK" if self.accounted else "MISMATCH")
        if self.on_disk is not None:
            table.add_row("rows on disk (this shard)", f"{self.on_disk:,}, duplicates {self.duplicates_on_disk or 0}")
        table.add_row("retries / requeued", f"{self.retries:,} / {self.requeued:,}")
        table.add_row("output tokens", f"{self.output_tokens:,} ({self.output_tokens_per_s:,.0f} tok/s)")
        if self.done:
            table.add_row("hit max_tokens", f"{self.length_finished:,} ({self.length_finished / self.done:.0%} of done; "
                          "tokenize drops or trains on them cut off)")
        table.add_row("elapsed", f"{self.elapsed_s:,.1f}s")
        if self.rows_file:
            table.add_row("rows", self.rows_file)
        if self.stopped_reason:
            table.add_row("stopped", self.stopped_reason)
        console.print(table)
