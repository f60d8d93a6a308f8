"""Special-token text inside message content (`<|MASK|>`, `<|endoftext|>`, `<|im_end|>`, any special
added token) never becomes its special id in a trained row: the row is dropped and counted. And a
chat template that never finishes is refused before the first row, in one line."""

from __future__ import annotations

import json

import pytest

from draftsmith.data.tokenized import read_shard
from draftsmith.tiny import synthetic_conversations
from draftsmith.tokenize.masking import RowDropped
from test_tokenize_bad_rows import answer, run_tokenize, user
from tokenize_helpers import save_tokenizer_with_template, write_jsonl


def _specials(tokenizer) -> list[str]:
    return sorted({str(t.content) for t in tokenizer.added_tokens_decoder.values() if t.special})


def test_every_special_token_text_in_any_message_drops_the_row(make_masker, tiny_tokenizer):
    masker = make_masker()
    specials = _specials(tiny_tokenizer)
    assert {"<|MASK|>", "<|endoftext|>", "<|im_end|>"} <= set(specials), specials
    for token in specials:
        for messages, where in (([user("Spell cat."), answer(f"c a {token} t")], "messages[1].content"),
                                ([user(f"Spell {token} cat."), answer("c a t")], "messages[0].content"),
                                ([user("Spell cat."), answer("c a t", reasoning_content=f"think {token}")],
                                 "messages[1].reasoning_content")):
            with pytest.raises(RowDropped) as caught:
                masker.build({"id": "r", "messages": messages, "finish_reason": "stop"})
            assert caught.value.reason == "special_token_in_content", (token, caught.value)
            assert f"{where} contains the special token text {token!r}" in caught.value.detail
    # Text that only looks alike is text.
    built = masker.build({"id": "ok", "messages": [user("Spell cat."), answer("<|MASK> and |endoftext| c a t")],
                          "finish_reason": "stop"})
    assert built.loss_mask.sum() > 0


def test_tokenize_counts_them_and_no_written_row_trains_a_special_id(tmp_path, tiny_target_dir, tiny_tokenizer):
    good = list(synthetic_conversations(8, seed=3))
    planted = [{"id": f"planted-{i}", "messages": [user("Say it."), answer(f"Here: {token} done.")]}
               for i, token in enumerate(["<|MASK|>", "<|endoftext|>", "<|im_end|>"])]
    source = write_jsonl(tmp_path / "rows.jsonl", good[:4] + planted + good[4:])
    out = tmp_path / "out"
    done = run_tokenize(source, "-t", tiny_target_dir, "-o", out, "--workers", "1", "--no-progress", "--no-audit",
                        "--max-error-share", "0.5")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    summary = json.loads((out / "tokenize_summary.json").read_text())
    assert summary["dropped"] == {"special_token_in_content": 3} and summary["written"] == 8
    special_ids = {tiny_tokenizer.convert_tokens_to_ids(t) for t in ("<|MASK|>", "<|endoftext|>")}
    table = read_shard(out / "part-00000.arrow")
    for ids, mask in zip(table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist()):
        assert not [i for i, m in zip(ids, mask) if m and i in special_ids]


def test_a_template_that_never_finishes_is_refused_before_the_first_row(tmp_path, tiny_target_dir):
    looping = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    tokenizer = save_tokenizer_with_template(tiny_target_dir, looping, tmp_path / "tok")
    source = write_jsonl(tmp_path / "rows.jsonl", list(synthetic_conversations(2, seed=1)))
    done = run_tokenize(source, "-t", tokenizer, "-o", tmp_path / "out", "--workers", "1", "--no-progress", "--no-audit")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(f"draftsmith: error: --tokenizer {tokenizer}: the chat template did not finish rendering"), last
    assert not (tmp_path / "out" / "part-00000.arrow").exists()
