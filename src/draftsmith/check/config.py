"""The settings of `draftsmith check` (its CLI options come from this model) and its report."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from draftsmith.core.config import SequenceTokens, Threads, cli

Severity = Literal["error", "warning", "note"]


class CheckConfig(BaseModel):
    model_config = ConfigDict(extra="forbid")

    export: Annotated[Path, cli(positional=True)] = Field(
        description="exported drafter directory (`draftsmith export --out`)"
    )
    target: Path = Field(description="target model directory the drafter is served with (config, weights, tokenizer)")
    num_speculative_tokens: int | None = Field(
        None, ge=1, description="the vLLM num_speculative_tokens you serve with (checked against block_size - 1)"
    )
    sglang_draft_tokens: int | None = Field(
        None, ge=1, description="the SGLang --speculative-num-draft-tokens you serve with (checked against block_size)"
    )
    chat_template: Path | None = Field(
        None, description="chat template file the engine serves with (default: the target tokenizer's)"
    )
    template_kwargs: dict[str, Any] | None = Field(
        None, description='chat_template_kwargs sent when serving, e.g. {"enable_thinking": false} (default: none)'
    )
    parity: bool = Field(True, description="compare block logits with the reference dflash package on real target features")
    engines: bool = Field(True, description="ask each serving engine installed here (vLLM's registry, llama.cpp's "
                          "converter and graphs) whether it can serve this drafter on this target family")
    overfit: bool = Field(
        False, description="run the overfit gate: train a drafter, export, compare engine and in-process acceptance "
        "per held-out prompt and draft position"
    )
    overfit_dir: Path | None = Field(None, description="working directory of the overfit gate (default: <export>.overfit)")
    endpoint: str | None = Field(
        None, description="vLLM server serving <overfit-dir>/export with the target (the gate prints its command)"
    )
    overfit_samples: int = Field(160, ge=1, description="prompts the overfit gate trains on (the target's own answers)")
    overfit_steps: int = Field(120, ge=1, description="optimizer steps of the overfit gate's training")
    overfit_max_new_tokens: SequenceTokens = Field(64, ge=8, description="tokens the target generates for each gate prompt")
    overfit_train: bool = Field(
        True, description="train the gate's drafter; off: the gate judges the export's own weights (trained on varied data)"
    )
    threads: Threads | None = Field(None, description="torch CPU threads (default: one per CPU the machine's 1-minute load leaves idle, printed; at most 4 per CPU)")


class Finding(BaseModel):
    """One problem: the field, what it is, what it should be and the fix."""

    check: str
    field: str
    found: str
    expected: str
    fix: str
    severity: Severity = "error"

    def line(self) -> str:
        return f"{self.severity}: {self.field}: is {self.found}, should be {self.expected}; fix: {self.fix}"


class ParityResult(BaseModel):
    status: Literal["passed", "failed", "skipped"]
    detail: str
    max_abs_diff: float | None = None
    tolerance: str = ""
    context_tokens: int = 0
    block_size: int = 0


class CheckSummary(BaseModel):
    kind: str = "draftsmith.check"
    version: int = 1
    export: str
    target: str
    checks: list[str] = Field(default_factory=list)
    findings: list[Finding] = Field(default_factory=list)
    block_size: int | None = None
    vllm_num_speculative_tokens: int | None = None
    sglang_draft_tokens: int | None = None
    parity: ParityResult | None = None
    overfit: dict[str, Any] | None = None
    engines: list[dict[str, str]] = Field(default_factory=list)  # EngineSupport.to_dict() per engine

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    @property
    def passed(self) -> bool:
        return not self.errors

    @property
    def verdict(self) -> str:
        count = len(self.errors)
        state = "clean" if count == 0 else f"{count} finding{'s' * (count != 1)}"
        return (f"check: {state} ({len(self.checks)} checks, {len(self.warnings)} warning"
                f"{'s' * (len(self.warnings) != 1)})")

    def to_json(self) -> str:
        return json.dumps(self.model_dump(mode="json"), indent=2, allow_nan=False)

    def lines(self) -> list[str]:
        out = [finding.line() for finding in self.findings]
        if self.block_size is not None:
            out.append(f"serve: block_size {self.block_size} -> vLLM num_speculative_tokens "
                       f"{self.vllm_num_speculative_tokens}, " + (f"SGLang --speculative-num-draft-tokens "
                       f"{self.sglang_draft_tokens}" if self.sglang_draft_tokens is not None else "(DSpark: vLLM's dspark method)"))
        for engine in self.engines:
            word = {"yes": "can serve it", "no": "cannot serve it"}.get(engine["status"], "not checked")
            out.append(f"engine: {engine['engine']}: {word}: {engine['detail']}")
        if self.parity is not None:
            out.append(f"parity: {self.parity.status}: {self.parity.detail}")
        if self.overfit is not None and self.overfit.get("verdict"):
            out.append(f"overfit: {self.overfit['verdict']}")
        out.append(self.verdict)
        return out
