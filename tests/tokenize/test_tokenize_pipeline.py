"""End to end: files in, contract-2 Parquet shards and a summary out, in parallel, via API and CLI."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftsmith.cli import main
from draftsmith.core.errors import InputError
from draftsmith.data.tokenized import read_shard
from draftsmith.tiny import synthetic_conversations, synthetic_prompts
from draftsmith.tokenize import TokenizeError, TokenizeOptions, tokenize_dataset
from tokenize_helpers import generation_marker_template, save_tokenizer_with_template, write_jsonl


def mixed_rows(tokenizer, count=40):
    rows = list(synthetic_conversations(count, seed=21))
    rows[3]["finish_reason"] = "length"
    rows[5]["messages"][-1]["reasoning_content"] = ""
    engine = dict(rows[7])
    prompt = tokenizer.apply_chat_template(engine["messages"][:-1], tokenize=False, add_generation_prompt=True)
    final = engine["messages"][-1]
    completion = f"<think>\n{final['reasoning_content']}\n</think>\n\n{final['content']}<|im_end|>"
    engine["prompt_token_ids"] = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    engine["completion_token_ids"] = tokenizer(completion, add_special_tokens=False)["input_ids"]
    engine["finish_reason"] = "stop"
    rows[7] = engine
    rows.append(dict(rows[0]))  # duplicate id
    rows.append({"id": "prompt-only", "messages": rows[1]["messages"][:-1]})
    return rows


def read_shards(path):
    return pa.concat_tables([read_shard(shard) for shard in sorted(path.glob("part-*.arrow"))])


def test_tokenize_dataset_writes_contract_shards_and_counts(tmp_path, tiny_target_dir, tiny_tokenizer):
    source = write_jsonl(tmp_path / "rows.jsonl", mixed_rows(tiny_tokenizer))
    out = tmp_path / "out"
    options = TokenizeOptions(workers=2, chunk_size=4, rows_per_shard=16, max_error_share=0.1, progress=False)
    summary = tokenize_dataset(source, tiny_target_dir, out, options)

    assert summary.input_rows == 42
    assert summary.dropped == {"finish_reason_length": 1, "duplicate_id": 1, "no_assistant_turn": 1}
    assert summary.errors == 1 and summary.written == 39
    assert summary.by_method == {"template_prefix": 38, "engine_token_ids": 1}
    assert summary.verified == 39
    assert summary.shards == ["part-00000.arrow", "part-00001.arrow", "part-00002.arrow"]
    assert "prompt-only" in summary.examples["no_assistant_turn"][0]
    assert f"{source}:42" in summary.examples["no_assistant_turn"][0]
    assert summary.examples["duplicate_id"][0].startswith(f"{source}:41 ")

    table = read_shards(out)
    assert table.schema.field("id").type == pa.string()
    assert table.schema.field("input_ids").type == pa.list_(pa.int32())
    assert table.schema.field("loss_mask").type == pa.list_(pa.int8())
    assert table.schema.field("num_tokens").type == pa.int32()
    assert table.schema.field("num_trainable").type == pa.int32()
    assert table.schema.field("finish_reason").type == pa.string()
    assert table.num_rows == 39 and len(set(table.column("id").to_pylist())) == 39
    for input_ids, loss_mask, num_tokens, num_trainable in zip(
        table.column("input_ids").to_pylist(),
        table.column("loss_mask").to_pylist(),
        table.column("num_tokens").to_pylist(),
        table.column("num_trainable").to_pylist(),
    ):
        assert len(input_ids) == len(loss_mask) == num_tokens
        assert sum(loss_mask) == num_trainable and 0 < num_trainable < num_tokens
    assert summary.total_tokens == sum(table.column("num_tokens").to_pylist())

    on_disk = json.loads((out / "tokenize_summary.json").read_text())
    assert on_disk["written"] == 39 and on_disk["dropped"]["duplicate_id"] == 1
    assert not list(out.glob(".*.tmp"))


def test_output_does_not_depend_on_worker_count(tmp_path, tiny_target_dir):
    source = write_jsonl(tmp_path / "rows.jsonl", list(synthetic_conversations(50, seed=4)))
    tables = []
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        tokenize_dataset(source, tiny_target_dir, out, TokenizeOptions(workers=workers, chunk_size=7, progress=False))
        tables.append(read_shards(out))
    assert tables[0].equals(tables[1])


def test_keep_length_rows_and_truncate_overflow(tmp_path, tiny_target_dir):
    rows = list(synthetic_conversations(20, seed=8))
    for row in rows[:4]:
        row["finish_reason"] = "length"
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    options = TokenizeOptions(length_policy="keep", max_length=60, overflow="truncate", workers=1, progress=False)
    summary = tokenize_dataset(source, tiny_target_dir, tmp_path / "out", options)
    assert summary.written + summary.dropped_total == 20
    assert set(summary.dropped) <= {"truncated_no_trainable"}
    assert summary.truncated > 0 and summary.kept_length > 0
    table = read_shards(tmp_path / "out")
    assert max(table.column("num_tokens").to_pylist()) <= 60
    assert table.column("finish_reason").to_pylist().count("length") == summary.kept_length


def test_generation_marker_template_through_the_pipeline(tmp_path, tiny_target_dir):
    tokenizer_dir = save_tokenizer_with_template(tiny_target_dir, generation_marker_template(), tmp_path / "marked")
    source = write_jsonl(tmp_path / "rows.jsonl", list(synthetic_conversations(30, seed=9)))
    marked = tokenize_dataset(source, tokenizer_dir, tmp_path / "a", TokenizeOptions(workers=2, progress=False))
    plain = tokenize_dataset(source, tiny_target_dir, tmp_path / "b", TokenizeOptions(workers=1, progress=False))
    assert marked.by_method == {"generation_markers": 30}
    assert read_shards(tmp_path / "a").equals(read_shards(tmp_path / "b"))
    assert plain.by_method == {"template_prefix": 30}


def test_prompt_only_input_fails_loudly(tmp_path, tiny_target_dir):
    source = write_jsonl(tmp_path / "prompts.jsonl", list(synthetic_prompts(30, seed=2)))
    with pytest.raises(TokenizeError) as caught:
        tokenize_dataset(source, tiny_target_dir, tmp_path / "out", TokenizeOptions(workers=1, progress=False))
    assert "no_assistant_turn 30" in str(caught.value)
    summary = json.loads((tmp_path / "out" / "tokenize_summary.json").read_text())
    assert summary["written"] == 0 and summary["errors"] == 30


def test_existing_output_is_not_silently_replaced(tmp_path, tiny_target_dir):
    source = write_jsonl(tmp_path / "rows.jsonl", list(synthetic_conversations(5, seed=3)))
    out = tmp_path / "out"
    tokenize_dataset(source, tiny_target_dir, out, TokenizeOptions(workers=1, progress=False))
    with pytest.raises(InputError, match="--resume to continue, --overwrite"):
        tokenize_dataset(source, tiny_target_dir, out, TokenizeOptions(workers=1, progress=False))
    again = tokenize_dataset(source, tiny_target_dir, out, TokenizeOptions(workers=1, overwrite=True, progress=False))
    assert again.written == 5 and len(list(out.glob("part-*.arrow"))) == 1


def test_malformed_input_stops_with_file_and_line(tmp_path, tiny_target_dir):
    rows = [json.dumps(row) for row in synthetic_conversations(10, seed=3)]
    rows.insert(6, '{"id": "broken", "messages": [{"role": "user", "content": "Hi"}')
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    with pytest.raises(InputError, match=rf"{source}:7: invalid JSON"):
        tokenize_dataset(source, tiny_target_dir, tmp_path / "out", TokenizeOptions(workers=2, chunk_size=2, progress=False))


def test_cli_tokenize(tmp_path, tiny_target_dir, capsys):
    source = write_jsonl(tmp_path / "rows.jsonl", list(synthetic_conversations(12, seed=6)))
    out = tmp_path / "out"
    code = main(["tokenize", str(source), "--tokenizer", str(tiny_target_dir), "--out", str(out),
                 "--workers", "2", "--no-audit", "--no-progress", "--verify-share", "0.5"])
    assert code == 0
    assert "wrote 12 of 12 rows" in capsys.readouterr().err
    assert read_shard(out / "part-00000.arrow").num_rows == 12


def test_cli_reports_bad_input_and_bad_options(tmp_path, tiny_target_dir, capsys):
    source = write_jsonl(tmp_path / "rows.jsonl", ['{"id": "x", "messages": [{"role": "robot", "content": "Hi"}]}'])
    base = ["tokenize", str(source), "--tokenizer", str(tiny_target_dir), "--no-audit", "--no-progress"]
    assert main(base + ["--out", str(tmp_path / "a")]) == 2
    assert f"{source}:1: messages[0]: unknown speaker 'robot'" in capsys.readouterr().err
    assert main(base + ["--out", str(tmp_path / "b"), "--overflow", "sometimes"]) == 2
    assert "overflow" in capsys.readouterr().err
    assert main(base + ["--out", str(tmp_path / "c"), "--tokenizer", str(tmp_path)]) == 2
    assert "cannot load a tokenizer" in capsys.readouterr().err


def test_template_kwargs_reach_the_template(tmp_path, tiny_target_dir):
    # The tiny template has no kwarg of its own; a custom one shows the value is passed through.
    template = (
        "{%- for m in messages -%}{{- '<|im_start|>' + m.role + '\\n' + (prefix if m.role == 'user' else '') "
        "+ m.content + '<|im_end|>\\n' -}}{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"
    )
    tokenizer_dir = save_tokenizer_with_template(tiny_target_dir, template, tmp_path / "kw")
    rows = list(synthetic_conversations(3, seed=1))
    for row in rows:
        row["messages"][-1]["reasoning_content"] = ""  # this template has no place for reasoning
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    options = TokenizeOptions(workers=1, progress=False, chat_template_kwargs={"prefix": "Q: "})
    tokenize_dataset(source, tokenizer_dir, tmp_path / "out", options)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    first = read_shards(tmp_path / "out").column("input_ids").to_pylist()[0]
    text = tokenizer.decode(first)
    assert "user\nQ: " in text
    mask = np.asarray(read_shards(tmp_path / "out").column("loss_mask").to_pylist()[0])
    assert tokenizer.decode(np.asarray(first)[mask == 1].tolist()).endswith("<|im_end|>")


def test_nothing_written_is_an_error_not_a_silent_success(tmp_path, tiny_target_dir):
    rows = list(synthetic_conversations(4, seed=3))
    for row in rows:
        row["finish_reason"] = "length"
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    with pytest.raises(TokenizeError, match="no row was written.*finish_reason_length 4"):
        tokenize_dataset(source, tiny_target_dir, tmp_path / "out", TokenizeOptions(workers=1, progress=False))
    empty = write_jsonl(tmp_path / "empty.jsonl", [])
    with pytest.raises(InputError, match="no rows to tokenize"):
        tokenize_dataset(empty, tiny_target_dir, tmp_path / "out2", TokenizeOptions(workers=1, progress=False))


def test_cli_shows_the_summary_when_it_fails(tmp_path, tiny_target_dir, capsys):
    source = write_jsonl(tmp_path / "prompts.jsonl", list(synthetic_prompts(5, seed=2)))
    code = main(["tokenize", str(source), "-t", str(tiny_target_dir), "-o", str(tmp_path / "out"),
                 "--workers", "1", "--no-audit", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert "dropped: no_assistant_turn" in err and "draftsmith: error: 5 of 5 rows could not be masked" in err


def test_resume_skips_ids_already_written(tmp_path, tiny_target_dir):
    rows = list(synthetic_conversations(30, seed=12))
    first_part = write_jsonl(tmp_path / "first.jsonl", rows[:20])
    everything = write_jsonl(tmp_path / "all.jsonl", rows)
    out = tmp_path / "out"
    options = TokenizeOptions(workers=1, rows_per_shard=8, progress=False)
    tokenize_dataset(first_part, tiny_target_dir, out, options)
    (out / ".part-00003.arrow.tmp").write_bytes(b"half a shard from a crash")
    resumed = tokenize_dataset(everything, tiny_target_dir, out, options.model_copy(update={"resume": True, "workers": 2}))
    assert resumed.previously_written == 20 and resumed.skipped_already_written == 20
    assert resumed.written == 10 and resumed.input_rows == 30
    assert resumed.shards == [f"part-{index:05d}.arrow" for index in range(5)]
    assert not list(out.glob(".*.tmp"))
    fresh = tmp_path / "fresh"
    tokenize_dataset(everything, tiny_target_dir, fresh, options)
    by_id = lambda table: dict(zip(table.column("id").to_pylist(), table.column("input_ids").to_pylist()))  # noqa: E731
    assert by_id(read_shards(out)) == by_id(read_shards(fresh))
    with pytest.raises(InputError, match="choose one"):
        tokenize_dataset(everything, tiny_target_dir, out, options.model_copy(update={"resume": True, "overwrite": True}))


def test_sharegpt_parquet_input_end_to_end(tmp_path, tiny_target_dir, tiny_tokenizer):
    rows = [
        {
            "id": f"sg-{index}",
            "conversations": [
                {"from": "system", "value": "You are a helpful assistant."},
                {"from": "human", "value": f"Count from 1 to {index + 3}."},
                {"from": "gpt", "value": f"<think>\nI count up.\n</think>\n\nHere is the count: {index + 3}."},
            ],
        }
        for index in range(6)
    ]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "sharegpt.parquet")
    summary = tokenize_dataset(tmp_path / "sharegpt.parquet", tiny_target_dir, tmp_path / "out",
                               TokenizeOptions(workers=2, chunk_size=2, progress=False))
    assert summary.written == 6
    table = read_shards(tmp_path / "out")
    for index, (input_ids, loss_mask) in enumerate(zip(table.column("input_ids").to_pylist(), table.column("loss_mask").to_pylist())):
        trained = [token for token, keep in zip(input_ids, loss_mask) if keep]
        assert tiny_tokenizer.decode(trained) == f"<think>\nI count up.\n</think>\n\nHere is the count: {index + 3}.<|im_end|>"


def test_cli_audits_what_it_wrote_and_gates_on_the_verdict(tmp_path, tiny_target_dir, capsys):
    clean = write_jsonl(tmp_path / "clean.jsonl", list(synthetic_conversations(60, seed=8)))
    assert main(["tokenize", str(clean), "-t", str(tiny_target_dir), "-o", str(tmp_path / "clean"),
                 "--workers", "1", "--no-progress"]) == 0
    assert "audit: PASS" in capsys.readouterr().err

    # The disaster the audit exists for: most completions are the same empty-thinking boilerplate.
    rows = list(synthetic_conversations(60, seed=9))
    for row in rows[:52]:
        row["messages"][-1] = {"role": "assistant", "content": "OK.", "reasoning_content": ""}
    boilerplate = write_jsonl(tmp_path / "boilerplate.jsonl", rows)
    assert main(["tokenize", str(boilerplate), "-t", str(tiny_target_dir), "-o", str(tmp_path / "bad"),
                 "--workers", "1", "--no-progress"]) == 1
    assert "audit: FAIL" in capsys.readouterr().err


def test_a_generate_output_directory_is_read_for_its_rows_only(tmp_path, tiny_target_dir):
    from draftsmith.audit import audit_conversations

    generated = tmp_path / "generated"
    generated.mkdir()
    write_jsonl(generated / "generated-s0of1-00000.jsonl", list(synthetic_conversations(10, seed=4)))
    write_jsonl(generated / "generated-s0of1-00001.jsonl", list(synthetic_conversations(20, seed=5))[10:])
    (generated / "summary-s0of1.json").write_text(json.dumps({"input": 21, "done": 20, "failed": 1}))
    write_jsonl(generated / "failures-s0of1.jsonl", [{"id": "lost", "reason": "HTTP 400", "attempts": 1}])

    summary = tokenize_dataset(generated, tiny_target_dir, tmp_path / "tok", TokenizeOptions(workers=1, progress=False))
    assert summary.input_rows == 20 and summary.written == 20
    report = audit_conversations([generated]).to_dict()
    assert report["samples"] == 20 and report["bad_samples"] == 0, report


def test_manifest_refuses_a_resume_with_other_settings_and_train_refuses_a_stopped_run(tmp_path, tiny_target_dir):
    from draftsmith.core.manifest import read_manifest
    from draftsmith.train import TrainConfig, train_drafter

    rows = list(synthetic_conversations(30, seed=4))
    source = tmp_path / "rows.jsonl"
    # A run that stops part-way (here at a malformed row; a kill leaves the same state): shards on disk, no summary.
    source.write_text("".join(json.dumps(row) + "\n" for row in rows) + '{"id": "bad", "messages": 7}\n')
    out = tmp_path / "out"
    options = TokenizeOptions(workers=1, chunk_size=5, rows_per_shard=5, progress=False)
    with pytest.raises(InputError, match=":31"):
        tokenize_dataset(source, tiny_target_dir, out, options)
    assert list(out.glob("part-*.arrow")) and not (out / "tokenize_summary.json").exists()
    manifest = read_manifest(out)
    assert manifest["stage"] == "tokenize" and manifest["complete"] is False
    assert manifest["settings"]["tokenizer"].startswith("sha256:")
    with pytest.raises(InputError, match="the tokenized set is incomplete: the `tokenize` run that writes it did not finish"):
        train_drafter(TrainConfig(target=tiny_target_dir, data=out, out=tmp_path / "train", max_steps=1, device="cpu"))

    write_jsonl(source, rows)
    with pytest.raises(InputError, match=r"other settings \(length_policy: \"drop\" -> \"keep\"\)"):
        tokenize_dataset(source, tiny_target_dir, out, options.model_copy(update={"resume": True, "length_policy": "keep"}))
    finished = tokenize_dataset(source, tiny_target_dir, out, options.model_copy(update={"resume": True}))
    assert finished.previously_written > 0 and finished.previously_written + finished.written == 30
    assert read_manifest(out)["complete"] is True


def test_a_row_over_max_row_bytes_is_dropped_unread_and_counted(tmp_path, tiny_target_dir):
    rows = list(synthetic_conversations(6, seed=8))
    huge = dict(rows[2], id="huge")
    huge["messages"] = [{"role": "user", "content": "x" * 3_000_000}, rows[2]["messages"][-1]]
    source = write_jsonl(tmp_path / "rows.jsonl", rows[:3] + [huge] + rows[3:])
    options = TokenizeOptions(workers=1, progress=False, max_row_bytes=1_000_000)
    summary = tokenize_dataset(source, tiny_target_dir, tmp_path / "out", options)
    assert summary.written == 6 and summary.dropped == {"row_too_large": 1} and summary.errors == 0
    assert summary.examples["row_too_large"][0].startswith(f"{source}:4 (?): 3,000,")
    assert TokenizeOptions().max_row_bytes is None  # the shared default (core.limits: 64 MiB) applies


def test_a_run_stopped_by_its_error_gate_is_not_complete(tmp_path, tiny_target_dir):
    from draftsmith.core.manifest import read_manifest, require_complete

    rows = [*synthetic_conversations(10, seed=5), *synthetic_prompts(10, seed=6)]
    source = write_jsonl(tmp_path / "rows.jsonl", rows)
    out = tmp_path / "out"
    with pytest.raises(TokenizeError, match="10 of 20 rows could not be masked"):
        tokenize_dataset(source, tiny_target_dir, out, TokenizeOptions(workers=1, progress=False))
    assert json.loads((out / "tokenize_summary.json").read_text())["written"] == 10
    assert read_manifest(out)["complete"] is False
    with pytest.raises(InputError, match="the tokenized set is incomplete.*stopped on errors"):
        require_complete(out, "the tokenized set", "fix the rows and rerun")


def test_an_output_path_that_is_not_utf8_is_one_line_and_nothing_is_made(tmp_path, tiny_target_dir, capsys):
    """Arrow took it as far as the first shard (UnicodeEncodeError), leaving the directory half-made
    (issue 34 item 8); train --data of such a path is one line too."""
    import os

    from draftsmith.data.tokenized import load_tokenized

    source = write_jsonl(tmp_path / "rows.jsonl", list(synthetic_conversations(4, seed=6)))
    parent = os.fsdecode(os.fsencode(tmp_path) + b"/caf\xe9")
    out = os.path.join(parent, "out")
    code = main(["tokenize", str(source), "-t", str(tiny_target_dir), "-o", out, "--no-audit", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and "not UTF-8 (b'\\xe9')" in err
    assert not os.path.exists(parent)
    good = tmp_path / "good"
    assert main(["tokenize", str(source), "-t", str(tiny_target_dir), "-o", str(good), "--no-audit", "--no-progress"]) == 0
    os.rename(good, parent)
    with pytest.raises(InputError, match="not UTF-8"):
        load_tokenized(parent)
