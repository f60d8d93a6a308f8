"""`eval --baseline`: prompt-lookup (n-gram) speculation and an untrained drafter, beside the drafter."""

from __future__ import annotations

import json
import random

import pytest
import torch

from draftsmith.cli import main
from draftsmith.evaluate import (
    LosslessnessError,
    evaluate_drafter,
    greedy_decode,
    prompt_lookup_decode,
    prompt_lookup_drafts,
)
from draftsmith.evaluate.speculative import untrained_drafter
from draftsmith.model import DFlashDraftModel, build_drafter_config, save_drafter
from draftsmith.tiny import synthetic_prompts


@pytest.fixture(scope="module")
def drafter(target):
    torch.manual_seed(1)
    return DFlashDraftModel(build_drafter_config(target.config, num_draft_layers=1, block_size=8, mask_token_id=3)).eval()


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in synthetic_prompts(3, seed=11)))
    return path


def _chat_ids(tokenizer, text: str) -> torch.Tensor:
    ids = tokenizer.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True,
                                        return_dict=False)
    return torch.tensor([ids])


def _tau(result) -> float:
    return sum(result.acceptance_lengths) / len(result.acceptance_lengths)


def test_prompt_lookup_drafts_prefers_the_longest_then_earliest_match():
    #          0  1  2  3  4  5  6  7  8  9
    context = [5, 6, 7, 8, 1, 6, 7, 9, 2, 6, 7]
    # The 2-gram (6, 7) occurs at 1 and 5: the earliest wins, its continuation is 8, 1, 6, ...
    assert prompt_lookup_drafts(context, 3, max_ngram=3) == [8, 1, 6]
    # (2, 6, 7) occurs nowhere before; a 3-gram only when it exists earlier.
    assert prompt_lookup_drafts([2, 6, 7, 0, 0, 2, 6, 7], 2, max_ngram=3) == [0, 0]
    assert prompt_lookup_drafts([1, 2, 3, 4], 4) == []  # the last token never occurred before
    assert prompt_lookup_drafts(context, 3, max_ngram=3, min_ngram=3) == []  # no 3-gram repeats
    assert prompt_lookup_drafts([4, 4], 5) == [4]  # the continuation stops at the context's end
    assert prompt_lookup_drafts([9], 3) == []


def test_ngram_cycles_are_the_prompt_lookup_rule_replayed_on_the_target_output(target, tiny_tokenizer):
    """Each cycle accepts exactly the drafts (from the context so far) that agree with plain greedy
    output, plus the target's token: replayed here from token lists alone."""
    stops = [tiny_tokenizer.eos_token_id]
    first = _chat_ids(tiny_tokenizer, "Write apple river in capital letters.")
    answer = greedy_decode(target, first, 80, stops).tokens
    input_ids = torch.cat([first, torch.tensor([answer]), first], dim=1)
    plain = greedy_decode(target, input_ids, 80, stops).tokens
    spec = prompt_lookup_decode(target, input_ids, 80, stops, block_size=8)
    assert spec.tokens == plain

    expected, done = [], 1
    while done < len(plain):
        drafts = prompt_lookup_drafts(input_ids[0].tolist() + plain[:done], min(8, 80 - done) - 1)
        accepted = 0
        while accepted < len(drafts) and done + accepted < len(plain) and drafts[accepted] == plain[done + accepted]:
            accepted += 1
        committed = min(accepted + 1, len(plain) - done)
        expected.append(committed)
        done += committed
    assert spec.acceptance_lengths == expected


def test_ngram_tau_is_high_on_a_repeated_answer_and_about_one_on_random_text(target, tiny_tokenizer):
    stops = [tiny_tokenizer.eos_token_id]
    first = _chat_ids(tiny_tokenizer, "Write apple river in capital letters.")
    answer = greedy_decode(target, first, 80, stops).tokens
    # The prompt already holds the question and its answer once: the answer to the repeat copies it.
    repeated = torch.cat([first, torch.tensor([answer]), first], dim=1)
    spec = prompt_lookup_decode(target, repeated, 80, stops, block_size=8)
    assert spec.tokens == greedy_decode(target, repeated, 80, stops).tokens
    assert _tau(spec) > 2.5

    rng = random.Random(0)
    noise = torch.tensor([[rng.randrange(4, tiny_tokenizer.vocab_size) for _ in range(60)]])
    spec = prompt_lookup_decode(target, noise, 40, [], block_size=8)
    assert spec.tokens == greedy_decode(target, noise, 40, []).tokens
    assert _tau(spec) < 1.3


def test_eval_reports_the_baselines_beside_the_drafter(target, drafter, tiny_tokenizer, prompts_file):
    report = evaluate_drafter(target, drafter, prompts_file, max_new_tokens=40, tokenizer=tiny_tokenizer,
                              baselines=["ngram", "untrained"])
    assert [r.method for r in report.methods] == ["dflash", "ngram", "untrained"]
    for method in report.methods:
        assert method.lossless and method.num_prompts == 3 and method.block_size == 8
        assert 1.0 <= method.tau <= 8
        assert sum(k * v for k, v in method.acceptance_histogram.items()) + 3 == method.total_new_tokens
        assert method.target_tokens_per_s == report.target_tokens_per_s  # one plain decode per prompt
    assert report.total_new_tokens == report.baselines[0].total_new_tokens == report.baselines[1].total_new_tokens
    printed = json.loads(report.to_json())
    assert [b["method"] for b in printed["baselines"]] == ["ngram", "untrained"]
    assert "ngram tau" in report.verdict and "untrained tau" in report.verdict


def test_untrained_drafter_has_the_drafters_config_or_the_targets(target, drafter, tiny_tokenizer):
    fresh = untrained_drafter(target, drafter, 8, None, tiny_tokenizer, seed=5)
    assert fresh.config.to_dict() == drafter.config.to_dict()
    again = untrained_drafter(target, drafter, 8, None, tiny_tokenizer, seed=5)
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), again.state_dict().values()))
    assert not torch.equal(fresh.fc.weight, drafter.fc.weight)  # random, not the given weights
    built = untrained_drafter(target, None, 6, 7, tiny_tokenizer, seed=0)
    assert built.block_size == 6 and built.mask_token_id == 7
    assert built.config.num_target_layers == target.config.num_hidden_layers


def test_a_difference_in_a_baseline_fails_loudly(monkeypatch, target, drafter, tiny_tokenizer, prompts_file):
    import draftsmith.evaluate.speculative as speculative

    real = speculative.prompt_lookup_decode

    def corrupted(*args, **kwargs):
        result = real(*args, **kwargs)
        result.tokens[-1] = (result.tokens[-1] + 1) % 1000
        return result

    monkeypatch.setattr(speculative, "prompt_lookup_decode", corrupted)
    with pytest.raises(LosslessnessError, match="ngram: speculative greedy output differs"):
        evaluate_drafter(target, drafter, prompts_file, max_new_tokens=8, tokenizer=tiny_tokenizer, limit=2,
                         baselines=["ngram"])


def test_cli_eval_baselines_without_a_drafter(tmp_path, tiny_target_dir, prompts_file, capsys):
    code = main([
        "eval", "--target", str(tiny_target_dir), "--baseline", "ngram,untrained", "--mask-token-id", "3",
        "--block-size", "6", "--prompts", str(prompts_file), "--max-new-tokens", "24", "--limit", "2", "--json",
    ])  # fmt: skip
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["method"] == "ngram" and printed["block_size"] == 6 and printed["lossless"] is True
    assert [b["method"] for b in printed["baselines"]] == ["untrained"]


def test_cli_eval_drafter_with_ngram_table(tmp_path, tiny_target_dir, drafter, prompts_file, capsys):
    drafter_dir = save_drafter(drafter, tmp_path / "drafter")
    code = main([
        "eval", "--target", str(tiny_target_dir), "--drafter", str(drafter_dir), "--baseline", "ngram",
        "--prompts", str(prompts_file), "--max-new-tokens", "16", "--limit", "1",
    ])  # fmt: skip
    assert code == 0
    out = capsys.readouterr().out
    assert "tau by draft method" in out and "ngram" in out and "dflash tau" in out


@pytest.mark.parametrize("args, message", [
    (["--baseline", "medusa"], "--baseline"),
    (["--baseline", "ngram,ngram"], "twice"),
    (["--baseline", "ngram", "--ngram-min", "4"], "--ngram-min 4 is above --ngram-max 3"),
    ([], "--drafter and/or --baseline"),
])  # fmt: skip
def test_cli_eval_bad_baseline_flags(tiny_target_dir, prompts_file, capsys, args, message):
    code = main(["eval", "--target", str(tiny_target_dir), "--prompts", str(prompts_file), *args])
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_untrained_without_a_drafter_takes_the_tokenizers_mask_or_says_what_to_pass(
    tiny_target_dir, target, tiny_tokenizer, prompts_file, capsys
):
    from draftsmith.core.errors import InputError
    from draftsmith.model import mask_token_id

    code = main(["eval", "--target", str(tiny_target_dir), "--baseline", "untrained", "--prompts", str(prompts_file),
                 "--max-new-tokens", "4", "--limit", "1", "--json"])
    assert code == 0, capsys.readouterr().err
    assert json.loads(capsys.readouterr().out)["method"] == "untrained"
    assert untrained_drafter(target, None, 8, None, tiny_tokenizer, 0).mask_token_id == mask_token_id(tiny_tokenizer)
    with pytest.raises(InputError, match="no tokenizer to choose a mask token from; pass --mask-token-id"):
        untrained_drafter(target, None, 8, None, None, 0)
    with pytest.raises(InputError, match="outside the target's embedding table"):
        untrained_drafter(target, None, 8, 10**6, tiny_tokenizer, 0)


def test_more_drafters_share_the_plain_decode_and_report_under_their_names(
    tmp_path, target, drafter, tiny_tokenizer, prompts_file
):
    from draftsmith.core.errors import InputError

    saved = save_drafter(drafter, tmp_path / "step-1")
    report = evaluate_drafter(target, drafter, prompts_file, max_new_tokens=24, tokenizer=tiny_tokenizer, limit=2,
                              baselines=["ngram"], more_drafters={"step-1": saved, "same": drafter})
    assert [r.method for r in report.methods] == ["dflash", "ngram", "step-1", "same"]
    assert report.baselines[1].acceptance_histogram == report.acceptance_histogram == report.baselines[2].acceptance_histogram
    with pytest.raises(InputError, match="may not be named ngram"):
        evaluate_drafter(target, drafter, prompts_file, tokenizer=tiny_tokenizer, more_drafters={"ngram": drafter})
