"""eval stops at the chat template's end of turn (a Gemma GGUF's eos is another token), and shows
progress per prompt and token while a prompt runs."""

from __future__ import annotations

from draftsmith.evaluate.prompts import Prompt
from draftsmith.evaluate.speculative import evaluate_drafter
from draftsmith.model.speculative import default_stop_token_ids
from draftsmith.tiny.families import build_family_target


def test_a_gguf_style_gemma_stops_at_end_of_turn_and_progress_counts_every_token(tmp_path, capsys):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    folder = build_family_target("gemma3-gguf", tmp_path / "gemma")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    eos, turn_end = tokenizer.convert_tokens_to_ids("<eos>"), tokenizer.convert_tokens_to_ids("<end_of_turn>")
    target = AutoModelForCausalLM.from_pretrained(folder)
    assert target.generation_config.eos_token_id == eos  # the folder says only <eos>, as convert wrote it before
    assert default_stop_token_ids(target) == [eos]
    assert default_stop_token_ids(target, tokenizer) == [turn_end, eos]

    prompts = [Prompt(f"p{i}", [{"role": "user", "content": f"Count to {i + 3}."}]) for i in range(2)]
    calls, tokens = [], []
    report = evaluate_drafter(folder, None, prompts, max_new_tokens=6, baselines=["ngram"],
                              progress=lambda done, total: calls.append((done, total)), on_tokens=tokens.append)
    err = capsys.readouterr().err
    assert f"decoding stops at token ids [{turn_end}, {eos}] ('<end_of_turn>', '<eos>')" in err
    assert calls == [(0, 2), (1, 2), (2, 2)]  # the total before the first prompt ends
    # Every committed token is reported as it comes: the plain decode's and the method's.
    plain_and_method = 2 * report.total_new_tokens if report.lossless else None
    assert sum(tokens) == plain_and_method and max(tokens) <= report.block_size
    assert "projects to" not in err  # a short eval is no long one
