from __future__ import annotations

import json
import random
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftsmith.audit import AuditReport, Thresholds, audit_tokenized
from draftsmith.core.errors import InputError

from .conftest import TOKENIZED_SCHEMA, encode, tokenize_conversation, tokenized_rows, write_shards


def comparable(report: AuditReport) -> dict:
    data = report.to_dict()
    data.pop("paths")
    data["errors"] = [line.split(": ", 1)[-1] for line in data["errors"]]
    return data


def test_boilerplate_87_percent_fails_with_a_clear_verdict(boilerplate_dir, tiny_target_dir, tiny_tokenizer):
    report = audit_tokenized(boilerplate_dir, tokenizer=tiny_target_dir)

    assert not report.passed
    assert report.dominant_mask_sum.value == 6
    assert report.dominant_mask_sum.count == 261 and report.samples == 300
    assert report.dominant_span.text == "Okay.<|im_end|>"
    assert report.dominant_span.num_tokens == 6
    assert report.dominant_span.token_ids == encode(tiny_tokenizer, "Okay.<|im_end|>")
    assert len(report.dominant_span.example_ids) == 5
    failed = {gate.name for gate in report.failed_gates}
    assert {"dominant_mask_sum", "dominant_span"} <= failed
    assert report.checks["empty_thinking"].count == 0  # the template's untrained empty blocks
    assert report.verdict.startswith("FAIL")
    assert "87.0% of samples (261) have exactly 6 trainable tokens" in report.verdict
    assert "'Okay.<|im_end|>'" in report.verdict
    assert "\n" not in report.verdict


def test_boilerplate_fails_without_tokenizer_too(boilerplate_dir, tiny_tokenizer):
    report = audit_tokenized(boilerplate_dir)
    assert not report.passed
    assert {"dominant_mask_sum", "dominant_span"} <= {gate.name for gate in report.failed_gates}
    assert report.dominant_span.text is None
    assert report.dominant_span.token_ids == encode(tiny_tokenizer, "Okay.<|im_end|>")
    assert "token ids" in report.verdict
    assert not report.checks["missing_end_of_turn"].checked


def test_clean_dataset_passes(clean_dir, tiny_target_dir):
    report = audit_tokenized(clean_dir, tokenizer=tiny_target_dir)
    assert report.passed, report.verdict
    assert report.verdict.startswith("PASS: 300 tokenized samples")
    for name in ("empty_response", "empty_thinking", "missing_end_of_turn", "scaffolding_masked", "prompt_masked"):
        assert report.checks[name].checked
        assert report.checks[name].count == 0, name
    assert report.checks["trainable_count_mismatch"].count == 0
    data = report.to_dict()
    assert data["trainable"]["min"] >= 20
    assert sum(data["histogram"]["counts"]) == 300
    json.dumps(data)  # serialisable


def test_every_reader_format_gives_the_same_report(clean_rows, clean_dir, tmp_path, tiny_target_dir):
    import datasets

    table = pa.Table.from_pylist(clean_rows, schema=TOKENIZED_SCHEMA)
    single = tmp_path / "single.parquet"
    pq.write_table(table, single, row_group_size=50)
    arrow_file = tmp_path / "data.arrow"
    with pa.ipc.new_file(str(arrow_file), table.schema) as writer:
        writer.write_table(table, max_chunksize=70)
    stream_dir = tmp_path / "stream"
    stream_dir.mkdir()
    with pa.ipc.new_stream(str(stream_dir / "a.arrow"), table.schema) as writer:
        writer.write_table(table.slice(0, 120))
    with pa.ipc.new_stream(str(stream_dir / "b.arrow"), table.schema) as writer:
        writer.write_table(table.slice(120))
    dataset = datasets.Dataset.from_list(clean_rows)
    saved = tmp_path / "saved"
    dataset.save_to_disk(str(saved))
    saved_dict = tmp_path / "saved_dict"
    datasets.DatasetDict({"train": dataset}).save_to_disk(str(saved_dict))

    expected = comparable(audit_tokenized(clean_dir, tokenizer=tiny_target_dir))
    for path in (single, arrow_file, stream_dir, saved, saved_dict):
        assert comparable(audit_tokenized(path, tokenizer=tiny_target_dir, batch_size=64)) == expected, path


def test_batch_size_does_not_change_results(boilerplate_dir, tiny_target_dir):
    whole = comparable(audit_tokenized(boilerplate_dir, tokenizer=tiny_target_dir, batch_size=100_000))
    small = comparable(audit_tokenized(boilerplate_dir, tokenizer=tiny_target_dir, batch_size=7))
    assert small == whole


@pytest.mark.parametrize("keep_few", [False, True], ids=["default", "pruned-representatives"])
def test_span_hashes_agree_with_a_naive_grouping(tmp_path, monkeypatch, keep_few):
    if keep_few:  # force the bounded store of span texts to prune many times
        import draftsmith.audit.tokenized as tokenized

        monkeypatch.setattr(tokenized, "MAX_REPRESENTATIVES", 8)
        monkeypatch.setattr(tokenized, "TOP_PER_BATCH", 4)
    rng = random.Random(5)
    pool = [[rng.randrange(1000) for _ in range(rng.randint(1, 9))] for _ in range(30)]
    rows = []
    for index in range(2000):
        prompt = [rng.randrange(1000) for _ in range(rng.randint(0, 5))]
        answer = rng.choice(pool) if rng.random() < 0.7 else [rng.randrange(1000) for _ in range(rng.randint(0, 9))]
        rows.append(
            {
                "id": f"r{index}",
                "input_ids": prompt + answer,
                "loss_mask": [0] * len(prompt) + [1] * len(answer),
                "num_tokens": len(prompt) + len(answer),
                "num_trainable": len(answer),
                "finish_reason": None,
            }
        )
    report = audit_tokenized(write_shards(rows, tmp_path / "data", shard_rows=300), batch_size=128)

    spans = Counter(tuple(x for x, m in zip(r["input_ids"], r["loss_mask"]) if m) for r in rows)
    spans.pop((), None)
    top_span, top_count = spans.most_common(1)[0]
    assert report.dominant_span.count == top_count
    assert tuple(report.dominant_span.token_ids) == top_span
    assert report.checks["duplicate_completions"].count == sum(spans.values()) - len(spans)
    pairs = Counter(
        (tuple(x for x, m in zip(r["input_ids"], r["loss_mask"]) if not m), tuple(x for x, m in zip(r["input_ids"], r["loss_mask"]) if m))
        for r in rows
    )
    assert report.checks["duplicate_prompts"].count == len(rows) - len(pairs)
    sums = Counter(r["num_trainable"] for r in rows)
    assert report.dominant_mask_sum.count == max(sums.values())
    assert report.checks["empty_response"].count == sums[0]


def _row(row_id, input_ids, loss_mask, finish_reason="stop"):
    return {
        "id": row_id,
        "input_ids": input_ids,
        "loss_mask": loss_mask,
        "num_tokens": len(input_ids),
        "num_trainable": sum(loss_mask),
        "finish_reason": finish_reason,
    }


def _conversation(tokenizer, index, turns=1):
    messages = []
    for turn in range(turns):
        messages.append({"role": "user", "content": f"Question {index} part {turn}?"})
        messages.append({"role": "assistant", "content": f"Answer {index} to part {turn}.", "reasoning_content": f"Thinking about {index} {turn}."})
    return messages


def test_masking_mistakes_are_found(tmp_path, tiny_tokenizer, tiny_target_dir):
    tok = tiny_tokenizer
    header = encode(tok, "<|im_start|>assistant\n")
    rows = []
    for index in range(40):
        ids, mask = tokenize_conversation(tok, _conversation(tok, index))
        rows.append(_row(f"good-{index}", ids, mask))
    # Header trained on: the mask starts at <|im_start|> instead of after "assistant\n".
    ids, mask = tokenize_conversation(tok, _conversation(tok, 100))
    start = mask.index(1) - len(header)
    assert ids[start : start + len(header)] == header
    rows.append(_row("header-masked", ids, [0] * start + [1] * (len(ids) - start - 1) + [0]))
    # Everything trained on: prompt and scaffolding.
    ids, _ = tokenize_conversation(tok, _conversation(tok, 101))
    rows.append(_row("all-masked", ids, [1] * len(ids)))
    # End-of-turn token left out of the mask.
    ids, mask = tokenize_conversation(tok, _conversation(tok, 102))
    last = len(mask) - 1 - mask[::-1].index(1)
    rows.append(_row("no-eot", ids, mask[:last] + [0] * (len(mask) - last)))
    # Only the empty think block, whitespace and <|im_end|> trained on: an empty response.
    blank = _conversation(tok, 103)[:-1] + [{"role": "assistant", "content": " \n ", "reasoning_content": ""}]
    ids, mask = tokenize_conversation(tok, blank)
    rows.append(_row("blank", ids, mask))
    # Multi-turn with every assistant turn trained on is legitimate, not prompt masking.
    messages = _conversation(tok, 104, turns=3)
    text = tok.apply_chat_template(messages, tokenize=False)
    ids = encode(tok, text)
    mask, inside, position = [0] * len(ids), False, 0
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    while position < len(ids):
        if ids[position : position + len(header)] == header:
            position += len(header)
            inside = True
            continue
        if inside:
            mask[position] = 1
            inside = ids[position] != eot
        position += 1
    rows.append(_row("multi-turn", ids, mask))
    # Cut off by max_tokens, and longer than a small context.
    ids, mask = tokenize_conversation(tok, _conversation(tok, 105))
    rows.append(_row("truncated", ids, mask, finish_reason="length"))

    report = audit_tokenized(write_shards(rows, tmp_path / "data", shard_rows=16), tokenizer=tiny_target_dir)
    checks = report.checks
    assert checks["scaffolding_masked"].example_ids == ["header-masked", "all-masked"]
    assert checks["prompt_masked"].example_ids == ["all-masked"]
    assert checks["missing_end_of_turn"].example_ids == ["all-masked", "no-eot"]  # ends on "\n"
    assert checks["empty_response"].example_ids == ["blank"]
    assert checks["truncated"].example_ids == ["truncated"]
    assert not report.passed
    failed = {gate.name for gate in report.failed_gates}
    assert {"scaffolding_masked", "prompt_masked", "missing_end_of_turn", "empty_response"} <= failed

    longest = max(row["num_tokens"] for row in rows)
    over = audit_tokenized(tmp_path / "data", tokenizer=tiny_target_dir, max_context=longest - 1)
    assert over.checks["over_context"].count == sum(row["num_tokens"] > longest - 1 for row in rows)


def test_length_mismatch_null_and_invalid_rows_are_reported(tmp_path, clean_rows):
    rows = [dict(row) for row in clean_rows[:50]]
    rows[3] = dict(rows[3], loss_mask=rows[3]["loss_mask"][:-1])
    rows[7] = dict(rows[7], input_ids=None)
    rows[9] = dict(rows[9], loss_mask=[2] * len(rows[9]["input_ids"]))
    directory = write_shards(rows, tmp_path / "data", shard_rows=20)
    report = audit_tokenized(directory)

    assert report.samples == 50
    assert report.bad_samples == 2
    assert report.audited_samples == 47
    assert report.checks["length_mismatch"].count == 1
    assert report.checks["length_mismatch"].example_ids == [rows[3]["id"]]
    errors = "\n".join(report.errors)
    assert f"part-00000.parquet: row 3 (id {rows[3]['id']}): input_ids has" in errors
    assert f"part-00000.parquet: row 7 (id {rows[7]['id']}): input_ids or loss_mask is null" in errors
    assert f"row 9 (id {rows[9]['id']}): loss_mask values other than 0/1" in errors
    failed = {gate.name for gate in report.failed_gates}
    assert {"length_mismatch", "bad_samples"} <= failed


def test_thresholds_are_configurable(boilerplate_dir):
    lenient = Thresholds().updated(
        {"dominant_mask_sum": None, "dominant_span": 0.9, "duplicate_completions": None}
    )
    assert audit_tokenized(boilerplate_dir, thresholds=lenient).passed
    assert audit_tokenized(boilerplate_dir, thresholds={"dominant_mask_sum": None, "dominant_span": None,
                                                         "duplicate_completions": None}).passed
    with pytest.raises(InputError, match="unknown threshold 'nonsense'"):
        audit_tokenized(boilerplate_dir, thresholds={"nonsense": 0.1})


def test_unusable_inputs_raise_input_error(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        audit_tokenized(tmp_path / "missing")
    table = pa.table({"id": ["a"], "text": ["hello"]})
    pq.write_table(table, tmp_path / "wrong.parquet")
    with pytest.raises(InputError, match=r"missing column\(s\) input_ids, loss_mask"):
        audit_tokenized(tmp_path / "wrong.parquet")


def test_empty_dataset_fails_min_samples(tmp_path):
    pq.write_table(pa.Table.from_pylist([], schema=TOKENIZED_SCHEMA), tmp_path / "empty.parquet")
    report = audit_tokenized(tmp_path / "empty.parquet")
    assert not report.passed
    assert [gate.name for gate in report.failed_gates] == ["min_samples"]


def test_null_tokens_and_out_of_vocabulary_ids_are_bad_samples(tmp_path, clean_rows, tiny_tokenizer):
    rows = [dict(row) for row in clean_rows[:30]]
    rows[2] = dict(rows[2], input_ids=[None] + rows[2]["input_ids"][1:])
    rows[5] = dict(rows[5], input_ids=rows[5]["input_ids"][:-1] + [len(tiny_tokenizer) + 7])
    directory = write_shards(rows, tmp_path / "data")
    report = audit_tokenized(directory, tokenizer=tiny_tokenizer)
    assert report.bad_samples == 2 and report.audited_samples == 28
    assert "vocabulary size" in report.errors[-1]
    assert audit_tokenized(directory).bad_samples == 1  # without a tokenizer only the null is wrong


def test_conversation_rows_in_a_datasets_dir_are_detected(tmp_path):
    import datasets

    from draftsmith.audit import audit_conversations, detect_kind
    from draftsmith.tiny import synthetic_conversations

    saved = tmp_path / "conversations"
    datasets.Dataset.from_list(list(synthetic_conversations(40, seed=2))).save_to_disk(str(saved))
    assert detect_kind([saved]) == "conversations"
    report = audit_conversations(saved)
    assert report.samples == 40 and report.bad_samples == 0


def test_a_small_healthy_set_passes_and_small_boilerplate_still_fails(tmp_path, tiny_target_dir, tiny_tokenizer):
    # Five varied rows: every mask sum and span is seen once, which is not dominance.
    healthy_dir = write_shards(tokenized_rows(tiny_tokenizer, 5), tmp_path / "healthy")
    healthy = audit_tokenized(healthy_dir, tokenizer=tiny_target_dir)
    assert healthy.samples == 5 and healthy.dominant_span.count == 1
    assert healthy.passed, healthy.verdict
    # Five copies of the same boilerplate completion repeat: still dominant.
    rows = tokenized_rows(tiny_tokenizer, 5, boilerplate_share=1.0)
    boilerplate = audit_tokenized(write_shards(rows, tmp_path / "boilerplate"), tokenizer=tiny_target_dir)
    assert {"dominant_mask_sum", "dominant_span"} <= {gate.name for gate in boilerplate.failed_gates}
    # The minimum count is a threshold like the others.
    lenient = audit_tokenized(tmp_path / "boilerplate", thresholds={"dominant_min_count": 6})
    assert not {"dominant_mask_sum", "dominant_span"} & {gate.name for gate in lenient.failed_gates}


def test_repeated_ids_fail_the_gate_that_train_would_enforce(tmp_path, clean_rows):
    from draftsmith.train import load_tokenized

    rows = [dict(row) for row in clean_rows[:40]]
    rows[30]["id"] = rows[3]["id"]
    rows[31]["id"] = rows[3]["id"]
    directory = write_shards(rows, tmp_path / "data", shard_rows=16)  # the repeats are in another shard
    report = audit_tokenized(directory)
    check = report.checks["repeated_ids"]
    assert check.count == 2 and check.example_ids == [rows[3]["id"]]
    assert [gate.name for gate in report.failed_gates] == ["repeated_ids"]
    with pytest.raises(InputError, match="duplicate id"):
        load_tokenized(directory)
    assert audit_tokenized(write_shards(clean_rows[:40], tmp_path / "clean", shard_rows=16)).checks["repeated_ids"].count == 0
