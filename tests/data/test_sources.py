"""Sources: every file kind, folders, datasets dirs and the split rule, streaming and counting."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftsmith.core.errors import InputError
from draftsmith.data.conversation import parse_conversation
from draftsmith.data.generated import engine_fields
from draftsmith.data.sources import count_records, detect_kind, iter_records, resolve

ROW = {
    "id": "a1",
    "messages": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello.", "reasoning_content": "Greet back."},
    ],
    "finish_reason": "stop",
}


def write_jsonl(path, rows):
    path.write_text("".join((row if isinstance(row, str) else json.dumps(row)) + "\n" for row in rows))
    return path


def read_all(paths, split=None):
    return [parse_conversation(record) for record in iter_records(resolve(paths, split))]


def test_jsonl_rows_keep_engine_fields(tmp_path):
    with_ids = {**ROW, "id": "a2", "prompt_token_ids": [1, 2], "completion_token_ids": [3, 4]}
    path = write_jsonl(tmp_path / "rows.jsonl", [ROW, "", with_ids])
    rows = read_all([path])
    assert [row.id for row in rows] == ["a1", "a2"]
    assert rows[0].where == f"{path}:1" and rows[1].where == f"{path}:3"
    fields = engine_fields(rows[1])
    assert fields["prompt_token_ids"] == [1, 2] and fields["completion_token_ids"] == [3, 4]
    assert fields["finish_reason"] == "stop"
    assert rows[0].messages[-1]["reasoning_content"] == "Greet back."
    assert count_records(resolve([path])) == 2


def test_content_parts_and_null_fields(tmp_path):
    row = {
        "id": "v1",
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Hi "}, {"type": "text", "text": "there"}]},
            {"role": "assistant", "content": "Hello.", "reasoning": "Greet back.", "tool_calls": None},
        ],
    }
    messages = read_all([write_jsonl(tmp_path / "v.jsonl", [row])])[0].messages
    assert messages[0]["content"] == "Hi there"
    assert messages[1]["reasoning_content"] == "Greet back." and "tool_calls" not in messages[1]


def test_parquet_arrow_gzip_json_array_and_datasets_dirs(tmp_path):
    from datasets import Dataset

    table = pa.Table.from_pylist([ROW, {**ROW, "id": "a2"}])
    pq.write_table(table, tmp_path / "rows.parquet")
    with pa.OSFile(str(tmp_path / "rows.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    Dataset.from_list([ROW, {**ROW, "id": "a3"}]).save_to_disk(str(tmp_path / "hf"))
    with gzip.open(tmp_path / "rows.jsonl.gz", "wt") as handle:
        handle.write(json.dumps(ROW) + "\n")
    (tmp_path / "rows.json").write_text(json.dumps([ROW, {**ROW, "id": "a4"}], indent=1))
    assert [row.id for row in read_all([tmp_path / "rows.parquet"])] == ["a1", "a2"]
    assert [row.id for row in read_all([tmp_path / "rows.arrow"])] == ["a1", "a2"]
    assert [row.id for row in read_all([tmp_path / "rows.jsonl.gz"])] == ["a1"]
    assert [row.id for row in read_all([tmp_path / "rows.json"])] == ["a1", "a4"]
    hf_rows = read_all([tmp_path / "hf"])
    assert [row.id for row in hf_rows] == ["a1", "a3"]
    assert hf_rows[0].messages[-1]["reasoning_content"] == "Greet back."
    assert count_records(resolve([tmp_path / "hf", tmp_path / "rows.parquet", tmp_path / "rows.json"])) == 6
    assert read_all([tmp_path / "rows.parquet"])[1].where == f"{tmp_path / 'rows.parquet'}: row 1"


def test_folders_are_walked_recursively_in_sorted_order(tmp_path):
    from datasets import Dataset

    (tmp_path / "b").mkdir()
    write_jsonl(tmp_path / "b" / "x.jsonl", [{**ROW, "id": "b"}])
    (tmp_path / "a" / "deep").mkdir(parents=True)
    write_jsonl(tmp_path / "a" / "deep" / "z.jsonl", [{**ROW, "id": "a-deep"}])
    write_jsonl(tmp_path / "a" / "y.jsonl", [{**ROW, "id": "a-y"}])
    Dataset.from_list([{**ROW, "id": "c-hf"}]).save_to_disk(str(tmp_path / "c"))
    (tmp_path / ".hidden.jsonl").write_text("not json\n")
    (tmp_path / "notes.txt").write_text("ignored\n")
    assert [row.id for row in read_all([tmp_path])] == ["a-deep", "a-y", "b", "c-hf"]


def test_generate_output_dir_gives_only_its_row_shards(tmp_path):
    write_jsonl(tmp_path / "generated-s0of1-00000.jsonl", [ROW])
    (tmp_path / "summary-s0of1.json").write_text(json.dumps({"done": 1}))
    write_jsonl(tmp_path / "failures-s0of1.jsonl", [{"id": "x", "reason": "timeout"}])
    assert resolve(tmp_path) == [tmp_path / "generated-s0of1-00000.jsonl"]


def test_a_generate_dir_where_every_sample_failed_holds_no_rows(tmp_path, capsys):
    """Its failures file is bookkeeping, not rows to audit or train on, even when it is all there is."""
    from draftsmith.cli import main

    (tmp_path / "summary-s0of1.json").write_text(json.dumps({"done": 0, "failed": 1}))
    write_jsonl(tmp_path / "failures-s0of1.jsonl", [{"id": "x", "reason": "timeout"}])
    with pytest.raises(InputError, match="every sample failed"):
        resolve(tmp_path)
    assert main(["audit", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"draftsmith: error: {tmp_path}: a generate output directory without generated rows")


def test_one_split_rule_for_dataset_dicts(tmp_path):
    from datasets import Dataset, DatasetDict

    def save(name, **splits):
        DatasetDict({split: Dataset.from_list([{**ROW, "id": f"{split}-{i}"} for i in range(n)])
                     for split, n in splits.items()}).save_to_disk(str(tmp_path / name))
        return tmp_path / name

    both = save("both", train=2, test=1)
    assert [row.id for row in read_all(both)] == ["train-0", "train-1"]
    assert [row.id for row in read_all(both, split="test")] == ["test-0"]
    assert [row.id for row in read_all(save("only", validation=1))] == ["validation-0"]
    with pytest.raises(InputError, match=r"splits a, b and none is 'train'; pass --split NAME"):
        resolve(save("ab", a=1, b=1))
    with pytest.raises(InputError, match=r"no split 'dev'; the splits are train, test"):
        resolve(both, split="dev")


def test_detect_kind(tmp_path):
    write_jsonl(tmp_path / "rows.jsonl", [ROW])
    pq.write_table(pa.table({"id": ["x"], "input_ids": [[1, 2]], "loss_mask": [[0, 1]]}), tmp_path / "tok.parquet")
    pq.write_table(pa.table({"text": ["x"]}), tmp_path / "other.parquet")
    assert detect_kind(tmp_path / "rows.jsonl") == "conversations"
    assert detect_kind([tmp_path / "tok.parquet"]) == "tokenized"
    with pytest.raises(InputError, match="mixed inputs"):
        detect_kind([tmp_path / "rows.jsonl", tmp_path / "tok.parquet"])
    with pytest.raises(InputError, match="neither tokenized"):
        detect_kind([tmp_path / "other.parquet"])


def test_missing_and_unknown_inputs(tmp_path):
    with pytest.raises(InputError, match="no such file or directory"):
        resolve([tmp_path / "nope.jsonl"])
    (tmp_path / "rows.csv").write_text("id,messages\n")
    with pytest.raises(InputError, match="unknown input format"):
        resolve([tmp_path / "rows.csv"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no"):
        resolve([tmp_path / "empty"])


@pytest.mark.parametrize("stage_args", [
    ["audit"],
    ["tokenize", "--tokenizer", "{tmp}", "-o", "{tmp}/tok"],
    ["generate", "-o", "{tmp}/gen", "-e", "http://127.0.0.1:9"],
    ["bench", "-e", "http://127.0.0.1:9"],
    ["eval", "--target", "{tmp}", "--drafter", "{tmp}", "--prompts"],
], ids=lambda args: args[0])
def test_every_row_reading_stage_applies_the_one_split_rule(tmp_path, capsys, stage_args):
    from datasets import Dataset, DatasetDict

    from draftsmith.cli import main

    rows = tmp_path / "dd"
    DatasetDict({"train": Dataset.from_list([ROW]), "test": Dataset.from_list([ROW])}).save_to_disk(str(rows))
    args = [arg.replace("{tmp}", str(tmp_path)) for arg in stage_args]
    args = [*args, str(rows)] if args[0] == "eval" else [args[0], str(rows), *args[1:]]
    assert main([*args, "--split", "dev"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("draftsmith: error:") and "no split 'dev'; the splits are train, test" in err[-1]


def test_split_on_an_input_that_is_not_a_dataset_dict_is_an_error(tmp_path):
    path = write_jsonl(tmp_path / "rows.jsonl", [ROW])
    with pytest.raises(InputError, match=rf"^{path}: --split 'test' chooses a split of a DatasetDict .* drop --split$"):
        resolve([path], split="test")
    with pytest.raises(InputError, match="--split 'test' chooses a split"):
        detect_kind([path], split="test")
    assert resolve([path]) == [path]


def test_invalid_utf8_in_a_json_array_names_file_and_line(tmp_path):
    path = tmp_path / "rows.json"
    path.write_bytes(b'[\n  {"id": "a", "messages": []},\n  {"id": "b\xff"}\n]\n')
    for call in (lambda: list(iter_records(resolve([path]))), lambda: count_records([path])):
        with pytest.raises(InputError, match=rf"^{path}:3: not valid UTF-8 \(byte \d+ of the file: b'\\xff\"}}\\n'\)"):
            call()
    path.write_bytes(b"\xff\xfe[" + b" " * 10000)  # invalid in the first bytes too
    with pytest.raises(InputError, match=rf"^{path}:1: not valid UTF-8"):
        list(iter_records(resolve([path])))


@pytest.mark.parametrize("kind", ["jsonl", "json"])
def test_a_lone_surrogate_in_a_row_is_a_one_line_error(tmp_path, kind):
    row = json.dumps({"id": "s", "messages": [{"role": "user", "content": "bad \\ud800 here"},
                                              {"role": "assistant", "content": "ok \\ud83d\\ude00"}]})
    row = row.replace("\\\\u", "\\u")  # an escape JSON allows, decoding to an unpaired surrogate
    path = tmp_path / f"rows.{kind}"
    path.write_text(row + "\n" if kind == "jsonl" else f"[{row}]")
    where = f"{path}:1" if kind == "jsonl" else f"{path}: row 0"
    with pytest.raises(InputError) as caught:
        read_all([path])
    assert str(caught.value) == (
        f"{where}: malformed string in messages[0].content: a lone UTF-16 surrogate '\\ud800' at character 4 "
        "(text must be valid Unicode)"
    )
    # A surrogate pair (how ensure_ascii JSON writes an emoji) is text.
    path.write_text(row.replace("\\ud800", "") + "\n" if kind == "jsonl" else f"[{row.replace(chr(92) + 'ud800', '')}]")
    assert read_all([path])[0].messages[1]["content"] == "ok \U0001F600"


def test_a_folder_with_a_link_to_itself_or_a_cycle_is_read_once(tmp_path):
    """Issue 27.9: folders are walked through links, and a link to the folder itself or to one above
    it made the walk read the same files again and again (exponentially: it never finished)."""
    import signal

    from draftsmith.data.sources import detect_kind, resolve

    row = json.dumps({"id": "x", "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})
    root = tmp_path / "data"
    (root / "sub").mkdir(parents=True)
    (root / "a.jsonl").write_text(row + "\n")
    (root / "sub" / "b.jsonl").write_text(row + "\n")
    (root / "itself").symlink_to(".", target_is_directory=True)
    (root / "sub" / "up").symlink_to("..", target_is_directory=True)
    (root / "sub" / "also-a.jsonl").symlink_to(root / "a.jsonl")

    def too_long(*_):
        raise AssertionError("the walk did not finish in 20 s: it is going round a cycle")

    previous = signal.signal(signal.SIGALRM, too_long)
    signal.alarm(20)
    try:
        files = resolve([root, root / "sub"])
        kind = detect_kind(root)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
    assert [path.relative_to(root) for path in files] == [Path("a.jsonl"), Path("sub/b.jsonl")]
    assert kind == "conversations"
