"""Logit parity: the export's block logits from draftsmith's model and from the reference `dflash`.

Both read the same exported directory and get the same inputs: the target's own layer features of a
chat prompt (draftsmith's feature definition, as engines compute it), and a block [last prompt token,
MASK x (B-1)] embedded with the target's embedding table. Logits come from the target's lm_head.
Computed in float32; the tolerance is |ours - reference| <= ATOL + RTOL * |reference| per logit
and the same argmax at every block position.

A DSpark drafter serves with two more heads the reference package does not know: the Markov bias
(`markov_w2(markov_w1[prev])` added to every position's logits) and the confidence head
(`proj([h ; markov_w1[prev]])`). Their reference is the formula vLLM's qwen3_dspark.py computes,
applied to the export's own tensors and the reference's hidden states, so each head is compared too
(all B positions, DSpark drafting from the anchor). Any non-finite value fails parity.
"""

from __future__ import annotations

from pathlib import Path

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


def block_hidden(drafter, target, tokenizer, mask_embedding=None):
    """(hidden [1, B, H], block ids [1, B], context length) of `drafter` on the target's features of
    PROMPT; the block's mask positions take `mask_embedding` when the export ships one (the reference
    knows no mask_embedding.pt, so both sides are handed the same block embedding)."""
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
    return hidden, ids, int(context.shape[1])


def block_logits(drafter, target, tokenizer, mask_embedding=None):
    """(logits [1, B-1, V], context length): `block_hidden`'s mask positions scored by the target's lm_head."""
    import torch

    from draftsmith.model import target_lm_head

    hidden, _, context = block_hidden(drafter, target, tokenizer, mask_embedding)
    with torch.no_grad():
        logits = drafter.compute_logits(hidden[:, 1:], target_lm_head(target))
    return logits.float(), context


def _compare(mine, theirs) -> tuple[bool, float]:
    """(within tolerance and finite on both sides, max |diff|; inf when either side is not finite)."""
    import torch

    if not (bool(torch.isfinite(mine).all()) and bool(torch.isfinite(theirs).all())):
        return False, float("inf")
    diff = (mine - theirs).abs()
    return bool((diff <= ATOL + RTOL * theirs.abs()).all()), float(diff.max())


def dspark_head_parity(ours, reference, export_dir, target, tokenizer) -> list[tuple[str, bool, float]]:
    """(head, close, max |diff|) of the Markov-biased logits and the confidence logits of every block
    position: draftsmith's DSpark model against vLLM's formula on the export's tensors and the
    reference's hidden states. `prev` are the prompt's last B tokens: the formula is the same for any
    previous token, so real ids exercise it as well as drafted ones."""
    import torch

    from draftsmith.model import target_lm_head
    from draftsmith.model.io import read_safetensors

    tensors: dict = {}
    for file in sorted(export_dir.glob("*.safetensors")):
        tensors.update({name.removeprefix("model."): t.float() for name, t in read_safetensors(file).items()})
    head = target_lm_head(target)
    with torch.no_grad():
        mine_hidden, ids, _ = block_hidden(ours, target, tokenizer, ours.mask_embedding)
        their_hidden, _, _ = block_hidden(reference, target, tokenizer, ours.mask_embedding)
        block = mine_hidden.shape[1]
        previous = ids[:, -block:] if ids.shape[1] >= block else ids[:, :1].expand(1, block)
        mine_embed = ours.markov_embed(previous)
        mine = ours.markov_logits(ours.compute_logits(mine_hidden, head), mine_embed).float()
        their_embed = tensors["markov_head.markov_w1.weight"][previous]
        theirs = ours.compute_logits(their_hidden, head).float() + their_embed @ tensors["markov_head.markov_w2.weight"].T
        results = [("Markov-biased logits", *_compare(mine, theirs))]
        if ours.confidence_head is not None:
            features = their_hidden.float()
            if ours.confidence_head.with_markov:
                features = torch.cat([features, their_embed], dim=-1)
            theirs = features @ tensors["confidence_head.proj.weight"].T + tensors["confidence_head.proj.bias"]
            mine = ours.confidence(mine_hidden, mine_embed).float()
            results.append(("confidence logits", *_compare(mine, theirs.squeeze(-1))))
    return results


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
    close, diff = _compare(mine, theirs)
    same_argmax = bool(torch.equal(mine.argmax(-1), theirs.argmax(-1)))
    passed = close and same_argmax
    detail = (f"block logits max |diff| {diff:.2e} over {mine.shape[1]} draft positions x {mine.shape[2]} tokens "
              f"({context} context tokens), argmax {'identical' if same_argmax else 'DIFFERS'}"
              + ("" if bool(torch.isfinite(mine).all()) else ", NOT FINITE"))
    if getattr(ours, "markov_head", None) is not None:
        for head, head_close, head_diff in dspark_head_parity(ours, reference, Path(export_dir), target, tokenizer):
            passed = passed and head_close
            diff = max(diff, head_diff)
            detail += f"; {head} max |diff| {head_diff:.2e}" + ("" if head_close else " (FAILED)")
    return ParityResult(status="passed" if passed else "failed", detail=detail,
                        max_abs_diff=diff if diff != float("inf") else None,  # the report is strict JSON
                        tolerance=TOLERANCE, context_tokens=context, block_size=int(ours.block_size))
