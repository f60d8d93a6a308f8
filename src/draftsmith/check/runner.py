"""CheckConfig -> CheckSummary: the static checks, then logit parity when the drafter can run."""

from __future__ import annotations

from draftsmith.check.config import CheckConfig, CheckSummary, Finding
from draftsmith.check.inputs import ExportView, TargetView
from draftsmith.check.static import CHECKS, static_findings

# A drafter with these wrong cannot even run on the target's features: parity would only crash.
_BLOCKS_PARITY = {"layers", "shapes", "mask", "dspark", "variant", "finite"}


def _blocks_parity(finding: Finding) -> bool:
    if finding.severity != "error":
        return False
    return (finding.check in _BLOCKS_PARITY or (finding.check == "block" and finding.expected.startswith("an integer"))
            or (finding.check == "dtypes" and finding.field == "model.safetensors dtype"))


def target_architectures(export: ExportView, target: TargetView) -> list[str]:
    """The target's class names as engines look them up: its config's `architectures` (a bare string is
    one name, as transformers writes it back), else what the drafter recorded at training."""
    for value in (target.raw.get("architectures"), export.flash.get("target_architectures")):
        if isinstance(value, str) and value:
            return [value]
        if isinstance(value, list) and value:
            return [str(name) for name in value]
    return []


def _engine_findings(summary: CheckSummary, export: ExportView, target: TargetView) -> None:
    """Per engine installed here: can it serve this drafter on this target family (read from the engine)."""
    from draftsmith.model.engine_support import engine_support

    kind = export.variant or "dflash"  # the class an engine builds is the one `architectures` names
    supports = engine_support(target_architectures(export, target), kind)
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
    if block and export.variant == "dspark":  # DSpark drafts from the anchor: B tokens; SGLang serves none
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
