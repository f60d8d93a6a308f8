"""CheckConfig -> CheckSummary: the static checks, then logit parity when the drafter can run."""

from __future__ import annotations

from draftsmith.check.config import CheckConfig, CheckSummary, Finding
from draftsmith.check.inputs import ExportView, TargetView
from draftsmith.check.static import CHECKS, static_findings

# A drafter with these wrong cannot even run on the target's features: parity would only crash.
_BLOCKS_PARITY = {"layers", "shapes", "mask", "dspark"}


def _blocks_parity(finding: Finding) -> bool:
    if finding.severity != "error":
        return False
    return (finding.check in _BLOCKS_PARITY or (finding.check == "block" and finding.expected.startswith("an integer"))
            or (finding.check == "dtypes" and finding.field == "model.safetensors dtype"))


def _engine_findings(summary: CheckSummary, export: ExportView, target: TargetView) -> None:
    """Per engine installed here: can it serve this drafter on this target family (read from the engine)."""
    from draftsmith.model.engine_support import engine_support

    archs = target.raw.get("architectures") or export.flash.get("target_architectures") or []
    kind = "dspark" if "markov_rank" in export.raw else "dflash"
    supports = engine_support([str(a) for a in archs] if isinstance(archs, list) else [], kind)
    summary.checks.append("engines")
    summary.engines = [support.to_dict() for support in supports]
    for support in supports:
        if support.status == "no":
            summary.findings.append(Finding(
                check="engines", field=support.engine, found="cannot serve it", expected="an engine that serves it",
                fix=f"{support.detail}; the serving commands for it will fail on this target", severity="warning"))
    if supports and all(support.status == "no" for support in supports):
        summary.findings.append(Finding(
            check="engines", field="serving", found="no engine installed here can serve it", expected="at least one",
            fix="train a drafter for a target family an engine serves (see the engine lines)", severity="warning"))


def check_export(config: CheckConfig, target_model=None) -> CheckSummary:
    """Run every static check on `config.export` against `config.target` (and parity unless off)."""
    export = ExportView.read(config.export)
    target = TargetView.read(config.target)
    findings = static_findings(export, target, config)
    block = export.value("block_size")
    block = block if isinstance(block, int) and not isinstance(block, bool) else None
    summary = CheckSummary(
        export=str(config.export), target=str(config.target), checks=list(CHECKS), findings=findings,
        block_size=block, vllm_num_speculative_tokens=block - 1 if block else None, sglang_draft_tokens=block,
    )
    if block and "markov_rank" in export.raw:  # DSpark drafts from the anchor: B tokens; SGLang serves none
        summary.vllm_num_speculative_tokens, summary.sglang_draft_tokens = block, None
    if config.engines:
        _engine_findings(summary, export, target)
    if not config.parity:
        return summary
    summary.checks.append("parity")
    if any(_blocks_parity(f) for f in findings):
        from draftsmith.check.config import ParityResult

        summary.parity = ParityResult(status="skipped", detail="the drafter cannot run on this target (see above)")
        return summary
    from draftsmith.check.parity import TOLERANCE, logit_parity

    summary.parity = parity = logit_parity(export.path, target.path, tokenizer=target.tokenizer, target=target_model)
    if parity.status == "failed":
        summary.findings.append(Finding(
            check="parity", field="block logits", found=parity.detail, expected=TOLERANCE,
            fix="draftsmith's model and the reference dflash compute different functions from this config "
                "(an attention, RoPE or layer setting only one of them honours); fix the config or the model"))
    elif parity.status == "skipped":
        summary.findings.append(Finding(check="parity", field="reference dflash", found="not importable",
                                        expected="installed", fix=parity.detail, severity="warning"))
    return summary
