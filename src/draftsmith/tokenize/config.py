"""The `draftsmith tokenize` stage's config (`TokenizeOptions`, `TokenizeConfig`: every field a CLI
flag) and its `TokenizeSummary`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field

from draftsmith.core.config import SequenceTokens, cli

# A row this long is not a training sample but a mistake (a whole file pasted into a turn), and
# tokenizing it with offsets costs ~200x its size in memory: 50 MB took 10 GB.


class TokenizeOptions(BaseModel):
    """How to tokenize; every field has a CLI flag of the same name."""

    train_turns: Literal["final", "all"] = Field("final", description="assistant turns to train")
    length_policy: Literal["drop", "keep"] = Field("drop", description="rows with finish_reason 'length'")
    max_length: SequenceTokens | None = Field(default=None, ge=2, description="maximum tokens per row")
    overflow: Literal["drop", "truncate"] = Field("drop", description="rows longer than --max-length")
    verify_share: float = Field(default=1.0, ge=0.0, le=1.0, description="share of rows whose mask is verified by decoding")
    use_engine_token_ids: Annotated[bool, cli("--engine-token-ids/--no-engine-token-ids")] = Field(
        True, description="use prompt/completion token ids from the engine when present"
    )
    use_generation_markers: Annotated[bool, cli("--generation-markers/--no-generation-markers")] = Field(
        True, description="use {% generation %} markers when the template has them"
    )
    end_of_turn_tokens: Annotated[list[str], cli("--end-of-turn", split=False)] = Field(
        default_factory=list, description="extra end-of-turn token(s) besides the template's end of turn and the eos ids; repeatable"
    )
    chat_template_kwargs: Annotated[dict[str, Any], cli("--template-arg")] = Field(
        default_factory=dict, description="chat template kwarg KEY=VALUE (JSON value); repeatable"
    )
    workers: int | None = Field(default=None, ge=1, description="worker processes (default: CPU count)")
    chunk_size: int = Field(default=256, ge=1, description="rows per worker task (amortizes the IPC per row)")
    rows_per_shard: int = Field(default=10_000, ge=1, description="rows per part-NNNNN.parquet shard")
    overwrite: bool = Field(False, description="replace shards an earlier run left in --out")
    resume: bool = Field(False, description="keep shards an earlier run left in --out and skip their ids")
    max_error_share: float = Field(
        default=0.01, ge=0.0, le=1.0, description="fail when more than this share of rows cannot be masked"
    )
    progress: bool = Field(True, description="show a progress bar")
    split: str | None = Field(None, description="DatasetDict split to read (default: train, else the only one)")
    force_resume: bool = Field(False, description="resume into --out although it was written with other settings")
    allow_partial: bool = Field(
        False, description="use an input whose writer (generate, tokenize) is still running, as it is now; recorded in the manifest"
    )
    max_row_bytes: int | None = Field(
        None, ge=1, description="JSONL rows longer than this are dropped unread (counted as row_too_large); "
        "default $DRAFTSMITH_MAX_ROW_BYTES, else 64 MiB"
    )

    def output_settings(self) -> dict[str, Any]:
        """The options that shape the rows (a resume with others would mix two datasets)."""
        keys = ("train_turns", "length_policy", "max_length", "overflow", "use_engine_token_ids",
                "use_generation_markers", "end_of_turn_tokens", "chat_template_kwargs")  # fmt: skip
        return self.model_dump(mode="json", include=set(keys))

    def masker_config(self):
        """The `tokenize.masking.MaskerConfig` of these options."""
        from draftsmith.tokenize.masking import MaskerConfig

        return MaskerConfig(
            train_turns=self.train_turns,
            length_policy=self.length_policy,
            max_length=self.max_length,
            overflow=self.overflow,
            verify_share=self.verify_share,
            use_engine_token_ids=self.use_engine_token_ids,
            use_generation_markers=self.use_generation_markers,
            end_of_turn_tokens=tuple(self.end_of_turn_tokens),
            chat_template_kwargs=tuple(sorted(self.chat_template_kwargs.items())),
        )


class TokenizeConfig(TokenizeOptions):
    """A whole `draftsmith tokenize` run: what to read, with which tokenizer, where to write, and how."""

    inputs: Annotated[list[Path], cli(positional=True)] = Field(
        description="conversation rows: JSONL/Parquet/Arrow files, dirs of them, or datasets dirs"
    )
    tokenizer: Annotated[str, cli("--tokenizer", "-t")] = Field(
        description="target model or tokenizer dir (its chat template is used)"
    )
    out: Annotated[Path, cli("--out", "-o")] = Field(description="output directory for part-NNNNN.parquet shards")

    def options(self) -> TokenizeOptions:
        return TokenizeOptions.model_validate(self.model_dump(include=set(TokenizeOptions.model_fields)))


class TokenizeSummary(BaseModel):
    """What a tokenize run read, wrote and dropped (also written as `tokenize_summary.json`)."""

    kind: str = Field("draftsmith.tokenize", description="what wrote this file")
    version: int = Field(1, description="version of this summary's layout")
    output_dir: str = Field(description="the directory the shards were written to")
    tokenizer: str = Field(description="the tokenizer (target model) whose chat template was used")
    inputs: list[str] = Field(description="the input files read")
    input_rows: int = Field(0, description="rows read this run")
    written: int = Field(0, description="rows written this run")
    previously_written: int = Field(0, description="rows an earlier run left in the output (resume)")
    skipped_already_written: int = Field(0, description="input rows skipped because an earlier run wrote them")
    dropped: dict[str, int] = Field(default_factory=dict, description="rows not written, by drop reason")
    errors: int = Field(0, description="dropped rows that are data or template problems (not policy choices)")
    by_method: dict[str, int] = Field(default_factory=dict, description="written rows by how they were built")
    verified: int = Field(0, description="written rows whose mask was verified by decoding")
    truncated: int = Field(0, description="rows cut to --max-length")
    kept_length: int = Field(0, description="rows with finish_reason 'length' kept (--length-policy keep)")
    end_of_turn_appended: int = Field(0, description="rows whose end-of-turn token was appended (the row lacked it)")
    total_tokens: int = Field(0, description="tokens written")
    trainable_tokens: int = Field(0, description="tokens with loss_mask 1")
    shards: list[str] = Field(default_factory=list, description="the shard files, in order")
    elapsed_s: float = Field(0.0, description="wall time of the run")
    samples_per_s: float = Field(0.0, description="input rows per second")
    options: dict[str, Any] = Field(default_factory=dict, description="the options of the run")
    examples: dict[str, list[str]] = Field(default_factory=dict, description="a few examples per drop reason")
    thinking: str | None = Field(None, description="the thinking mode the chat template was rendered in, and why")

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    def to_dict(self) -> dict[str, Any]:
        return self.model_dump(mode="json")

    def render(self, console) -> None:
        """Print the counts as a rich table, one example per drop reason, and the verdict."""
        from rich.table import Table

        if self.thinking:
            console.print(f"tokenize: {self.thinking}", markup=False, highlight=False)
        table = Table(title=f"tokenize -> {self.output_dir}", show_header=True)
        table.add_column("what")
        table.add_column("rows", justify="right")
        table.add_row("input rows", str(self.input_rows))
        if self.previously_written:
            table.add_row("already in the output (resumed)", str(self.skipped_already_written))
        table.add_row("written", str(self.written))
        for method, count in sorted(self.by_method.items()):
            table.add_row(f"  built by {method}", str(count))
        table.add_row("  verified by decoding", str(self.verified))
        if self.truncated:
            table.add_row("  truncated to max length", str(self.truncated))
        if self.kept_length:
            table.add_row("  finish_reason length, kept", str(self.kept_length))
        if self.end_of_turn_appended:
            table.add_row("  end-of-turn appended to engine ids", str(self.end_of_turn_appended))
        for reason, count in sorted(self.dropped.items()):
            table.add_row(f"dropped: {reason}", str(count))
        console.print(table)
        for reason, examples in sorted(self.examples.items()):
            for example in examples[:1]:
                console.print(f"  e.g. {reason}: {example}", markup=False, highlight=False)
        console.print(self.verdict(), markup=False, highlight=False)

    def verdict(self) -> str:
        drops = ", ".join(f"{reason} {count}" for reason, count in sorted(self.dropped.items())) or "none"
        share = self.trainable_tokens / self.total_tokens if self.total_tokens else 0.0
        resumed = f" (resumed: {self.previously_written} rows were already there)" if self.previously_written else ""
        return (
            f"wrote {self.written} of {self.input_rows} rows{resumed} in {len(self.shards)} shard(s), "
            f"{self.total_tokens} tokens ({share:.1%} trained); dropped: {drops}"
        )
