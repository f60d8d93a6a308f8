from __future__ import annotations

import json

import pytest
import torch

from draftsmith.cli import main
from draftsmith.core.errors import InputError
from draftsmith.data.conversation import content_hash_id
from draftsmith.evaluate import (
    LosslessnessError,
    evaluate_drafter,
    greedy_decode,
    read_prompts,
    speculative_decode,
)
from draftsmith.model import DFlashDraftModel, build_drafter_config, save_drafter
from draftsmith.tiny import synthetic_prompts


@pytest.fixture(scope="module")
def drafter_config(target):
    return build_drafter_config(target.config, num_draft_layers=1, block_size=8, mask_token_id=3)


@pytest.fixture(scope="module")
def untrained_drafter(drafter_config):
    torch.manual_seed(0)
    return DFlashDraftModel(drafter_config).eval()


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    with path.open("w") as handle:
        for row in synthetic_prompts(3, seed=11):
            handle.write(json.dumps(row) + "\n")
    return path


def _prompt_ids(tokenizer, row):
    text = tokenizer.apply_chat_template(row["messages"], tokenize=False, add_generation_prompt=True)
    return torch.tensor([tokenizer(text, add_special_tokens=False)["input_ids"]])


class OracleDrafter(DFlashDraftModel):
    """Drafts the known greedy continuation, wrong at positions divisible by `wrong_every`.

    It still runs the real drafter forward (so caches and context features are exercised); only the
    logits are replaced, which lets the test drive every acceptance length through the loop.
    """

    def __init__(self, config, sequence, wrong_every=None):
        super().__init__(config)
        self.sequence = sequence
        self.wrong_every = wrong_every
        self.block_positions = None

    def forward(self, position_ids, **kwargs):
        self.block_positions = position_ids[0, -kwargs["noise_embedding"].shape[1] :].tolist()
        return super().forward(position_ids, **kwargs)

    def compute_logits(self, hidden, lm_head):
        vocab = lm_head.weight.shape[0]
        logits = torch.zeros(1, hidden.shape[1], vocab)
        for index, position in enumerate(self.block_positions[1:]):
            token = self.sequence[position] if position < len(self.sequence) else 0
            if self.wrong_every and position % self.wrong_every == 0:
                token = (token + 1) % vocab
            logits[0, index, token] = 1.0
        return logits


def test_untrained_drafter_is_lossless(target, untrained_drafter, tiny_tokenizer, prompts_file):
    report = evaluate_drafter(target, untrained_drafter, prompts_file, max_new_tokens=40, tokenizer=tiny_tokenizer)
    assert report.lossless and report.mismatched_prompts == []
    assert all(r.identical for r in report.per_prompt) and report.num_prompts == 3
    assert 1.0 <= report.tau < 2.0 and report.tau_engine_counting >= report.tau
    assert len(report.per_position_acceptance_engine_counting) == 7  # block 8: drafts at positions 1..7
    assert report.tau_engine_counting == pytest.approx(1 + sum(report.per_position_acceptance_engine_counting))
    assert sum(report.acceptance_histogram.values()) == report.total_cycles
    assert sum(k * v for k, v in report.acceptance_histogram.items()) + report.num_prompts == report.total_new_tokens
    assert report.speculative_tokens_per_s > 0 and report.target_tokens_per_s > 0
    assert json.loads(report.to_json())["kind"] == "draftsmith.eval"


@pytest.mark.parametrize("wrong_every, expect_tau_above", [(None, 6.0), (5, 2.5), (2, 1.4)])
def test_accepted_drafts_commit_exactly_the_target_output(
    target, drafter_config, tiny_tokenizer, wrong_every, expect_tau_above
):
    row = next(iter(synthetic_prompts(1, seed=5)))
    input_ids = _prompt_ids(tiny_tokenizer, row)
    plain = greedy_decode(target, input_ids, 60, [tiny_tokenizer.eos_token_id])
    sequence = input_ids[0].tolist() + plain.tokens
    torch.manual_seed(0)
    oracle = OracleDrafter(drafter_config, sequence, wrong_every).eval()
    spec = speculative_decode(target, oracle, input_ids, 60, [tiny_tokenizer.eos_token_id])
    assert spec.tokens == plain.tokens
    tau = sum(spec.acceptance_lengths) / len(spec.acceptance_lengths)
    assert tau > expect_tau_above
    assert max(spec.acceptance_lengths) <= drafter_config.block_size
    if wrong_every is None:
        assert spec.acceptance_lengths[0] == drafter_config.block_size


def test_max_new_tokens_is_respected(target, drafter_config, tiny_tokenizer):
    row = next(iter(synthetic_prompts(1, seed=5)))
    input_ids = _prompt_ids(tiny_tokenizer, row)
    plain = greedy_decode(target, input_ids, 11, [])
    oracle = OracleDrafter(drafter_config, input_ids[0].tolist() + greedy_decode(target, input_ids, 40, []).tokens)
    spec = speculative_decode(target, oracle.eval(), input_ids, 11, [])
    assert len(plain.tokens) == len(spec.tokens) == 11 and spec.tokens == plain.tokens


def test_a_difference_fails_loudly(monkeypatch, target, untrained_drafter, tiny_tokenizer, prompts_file):
    import draftsmith.evaluate.speculative as speculative

    real = speculative.speculative_decode

    def corrupted(*args, **kwargs):
        result = real(*args, **kwargs)
        result.tokens[-1] = (result.tokens[-1] + 1) % 1000
        return result

    monkeypatch.setattr(speculative, "speculative_decode", corrupted)
    with pytest.raises(LosslessnessError, match="differs from plain greedy"):
        evaluate_drafter(target, untrained_drafter, prompts_file, max_new_tokens=8, tokenizer=tiny_tokenizer, limit=2)
    report = evaluate_drafter(
        target, untrained_drafter, prompts_file, max_new_tokens=8, tokenizer=tiny_tokenizer, limit=2, strict=False
    )
    assert not report.lossless and len(report.mismatched_prompts) == 2


def test_cli_eval_json(tmp_path, tiny_target_dir, untrained_drafter, prompts_file, capsys):
    drafter_dir = save_drafter(untrained_drafter, tmp_path / "drafter")
    report_path = tmp_path / "report.json"
    code = main(
        [
            "eval", "--target", str(tiny_target_dir), "--drafter", str(drafter_dir), "--prompts", str(prompts_file),
            "--max-new-tokens", "24", "--limit", "2", "--json", "--out", str(report_path),
        ]
    )  # fmt: skip
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["lossless"] is True and printed["num_prompts"] == 2
    assert json.loads(report_path.read_text())["tau"] == printed["tau"]


def test_cli_eval_bad_drafter_dir(tmp_path, tiny_target_dir, prompts_file, capsys):
    code = main(["eval", "--target", str(tiny_target_dir), "--drafter", str(tmp_path), "--prompts", str(prompts_file)])
    assert code == 2
    assert "config.json: not found" in capsys.readouterr().err


def test_read_prompts_formats_and_errors(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(
        json.dumps({"id": "a", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "x"}]})
        + "\n"
        + json.dumps({"conversations": [{"from": "human", "value": "yo"}]})
        + "\n"
        + json.dumps({"prompt": "raw text"})
        + "\n"
    )
    prompts = read_prompts(path)
    # One id rule everywhere: the row's id, else a hash of the prompt (never the line number).
    assert [p.id for p in prompts] == [
        "a", content_hash_id([{"role": "user", "content": "yo"}]), content_hash_id([{"role": "user", "content": "raw text"}])
    ]
    assert prompts[0].messages == [{"role": "user", "content": "hi"}]
    assert prompts[1].messages == [{"role": "user", "content": "yo"}] and prompts[2].text == "raw text"
    path.write_text(json.dumps({"prompt": "ok"}) + "\n{broken\n")
    with pytest.raises(InputError, match=r"p.jsonl:2: invalid JSON"):
        read_prompts(path)
    path.write_text(json.dumps({"foo": 1}) + "\n")
    with pytest.raises(InputError, match=r"p.jsonl:1: row has neither 'messages' nor 'conversations'"):
        read_prompts(path)


def test_cli_eval_tables_and_bad_dtype(tmp_path, tiny_target_dir, untrained_drafter, prompts_file, capsys):
    drafter_dir = save_drafter(untrained_drafter, tmp_path / "drafter")
    args = ["eval", "--target", str(tiny_target_dir), "--drafter", str(drafter_dir), "--prompts", str(prompts_file)]
    assert main([*args, "--max-new-tokens", "8", "--limit", "1"]) == 0
    out = capsys.readouterr().out
    assert "acceptance length tau" in out and "lossless" in out and "accepted tokens per cycle" in out
    assert main([*args, "--dtype", "float64"]) == 2
    assert "--dtype must be one of" in capsys.readouterr().err
