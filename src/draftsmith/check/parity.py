"""Logit parity: the export's block logits from draftsmith's model and from the reference `dflash`.

Both read the same exported directory and get the same inputs: the target's own layer features of a
chat prompt (draftsmith's feature definition, as engines compute it), and a block [last prompt token,
MASK x (B-1)] embedded with the target's embedding table. Logits come from the target's lm_head.
Computed in float32; the tolerance is |ours - reference| <= ATOL + RTOL * |reference| per logit
and the same argmax at every block position.
"""

from __future__ import annotations

from draftsmith.check.config import ParityResult

ATOL = 1e-4
RTOL = 1e-4
TOLERANCE = f"|diff| <= {ATOL:g} + {RTOL:g}*|reference| per logit (float32), identical argmax"
PROMPT = [{"role": "user", "content": "Check that a drafter reads the same features the engine gives it."}]


def reference_available() -> tuple[bool, str]:
    try:
        import dflash  # noqa: F401
        from dflash import DFlashDraftModel  # noqa: F401
    except Exception as error:  # missing, or incompatible with this transformers
        return False, f"{type(error).__name__}: {error}"
    return True, ""


def _prompt_ids(tokenizer, vocab_size: int):
    import torch

    if tokenizer is not None and getattr(tokenizer, "chat_template", None):
        from draftsmith.data.prompts import generation_prompt_ids

        ids = generation_prompt_ids(tokenizer, PROMPT)
    else:
        ids = [(7 * i + 11) % vocab_size for i in range(24)]
    return torch.tensor([ids])


def block_logits(drafter, target, tokenizer, mask_embedding=None):
    """(logits [1, B-1, V], context length) of `drafter` on the target's features of PROMPT; the
    block's mask positions take `mask_embedding` when the export ships one (the reference knows
    no mask_embedding.pt, so both sides are handed the same block embedding)."""
    import torch

    from draftsmith.model import extract_target_features, target_embed_tokens, target_lm_head
    from draftsmith.model.drafter import replace_mask_rows

    ids = _prompt_ids(tokenizer, int(target.config.vocab_size))
    context = extract_target_features(target, ids[:, :-1], None, list(drafter.target_layer_ids))
    block = torch.full((1, int(drafter.block_size)), int(drafter.mask_token_id))
    block[0, 0] = ids[0, -1]
    noise = replace_mask_rows(target_embed_tokens(target)(block), block, int(drafter.mask_token_id), mask_embedding).detach()
    positions = torch.arange(context.shape[1] + block.shape[1]).unsqueeze(0)
    with torch.no_grad():
        hidden = drafter(position_ids=positions, noise_embedding=noise, target_hidden=context)
        logits = drafter.compute_logits(hidden[:, 1:], target_lm_head(target))
    return logits.float(), int(context.shape[1])


def logit_parity(export_dir, target_dir, tokenizer=None, target=None) -> ParityResult:
    """Compare draftsmith's and the reference's block logits on the export (see the module docstring)."""
    available, why = reference_available()
    if not available:
        return ParityResult(status="skipped", detail=f"reference dflash not importable ({why}); "
                            "pip install --no-deps dflash==0.1.0", tolerance=TOLERANCE)
    import torch
    from dflash import DFlashDraftModel as Reference
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # stdout/stderr carry the check's lines, not loading bars

    from draftsmith.model import load_drafter
    from draftsmith.model.target import load_target_model

    if target is None:
        target = load_target_model(target_dir, "cpu", torch.float32)
    ours = load_drafter(export_dir, dtype=torch.float32)
    try:
        reference = Reference.from_pretrained(str(export_dir), attn_implementation="sdpa", dtype=torch.float32).eval()
    except Exception as error:
        return ParityResult(status="failed", detail=f"the reference cannot load the export ({type(error).__name__}: "
                            f"{error})", tolerance=TOLERANCE)
    mine, context = block_logits(ours, target, tokenizer, ours.mask_embedding)
    theirs, _ = block_logits(reference, target, tokenizer, ours.mask_embedding)
    diff = float((mine - theirs).abs().max())
    close = bool(((mine - theirs).abs() <= ATOL + RTOL * theirs.abs()).all())
    same_argmax = bool(torch.equal(mine.argmax(-1), theirs.argmax(-1)))
    status = "passed" if close and same_argmax else "failed"
    detail = (f"block logits max |diff| {diff:.2e} over {mine.shape[1]} draft positions x {mine.shape[2]} tokens "
              f"({context} context tokens), argmax {'identical' if same_argmax else 'DIFFERS'}")
    return ParityResult(status=status, detail=detail, max_abs_diff=diff, tolerance=TOLERANCE,
                        context_tokens=context, block_size=int(ours.block_size))
