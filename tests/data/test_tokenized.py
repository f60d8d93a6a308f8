import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftsmith.core.errors import InputError
from draftsmith.data.tokenized import load_tokenized, write_tokenized

ROWS = [
    {"id": "a", "input_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1]},
    {"id": "b", "input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]},
    {"id": "c", "input_ids": [8, 9, 10, 11, 12], "loss_mask": [0, 1, 1, 1, 1]},
]


def test_parquet_shards_roundtrip_in_order(tmp_path):
    paths = write_tokenized(ROWS, tmp_path / "tok", shard_rows=2)
    assert [path.name for path in paths] == ["part-00000.parquet", "part-00001.parquet"]
    dataset = load_tokenized(tmp_path / "tok")
    assert [sample.id for sample in dataset.samples] == ["a", "b", "c"]
    assert dataset.total_tokens == 12 and dataset.total_trainable == 8
    table = pq.read_table(paths[0])
    assert table.schema.field("input_ids").type == pa.list_(pa.int32())
    assert table.schema.field("loss_mask").type == pa.list_(pa.int8())
    assert table.column("num_trainable").to_pylist() == [2, 2]
    truncated = load_tokenized(tmp_path / "tok", max_length=3)
    assert truncated[2].input_ids.tolist() == [8, 9, 10]
    assert truncated.fingerprint() != dataset.fingerprint()


def test_single_file_arrow_and_save_to_disk(tmp_path):
    import datasets

    table = pa.table({key: [row[key] for row in ROWS] for key in ("id", "input_ids", "loss_mask")})
    pq.write_table(table, tmp_path / "one.parquet")
    assert len(load_tokenized(tmp_path / "one.parquet")) == 3
    with pa.OSFile(str(tmp_path / "one.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    assert load_tokenized(tmp_path / "one.arrow")[1].loss_mask.tolist() == [0, 1, 1]
    datasets.Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "hf"))
    assert load_tokenized(tmp_path / "hf")[2].id == "c"


def test_bad_rows_are_named(tmp_path):
    bad = [dict(ROWS[0]), {"id": "broken", "input_ids": [1, 2, 3], "loss_mask": [1, 1]}]
    write_tokenized(bad[:1], tmp_path / "ok")
    pq.write_table(pa.table({"id": ["x", "broken"], "input_ids": [[1, 2], [1, 2, 3]], "loss_mask": [[0, 1], [1, 1]]}), tmp_path / "bad.parquet")
    with pytest.raises(InputError, match=r"bad.parquet: row 1 \(id broken\): input_ids has 3 tokens but loss_mask has 2"):
        load_tokenized(tmp_path / "bad.parquet")
    pq.write_table(pa.table({"id": ["x"], "input_ids": [[1, 2]], "loss_mask": [[0, 2]]}), tmp_path / "mask.parquet")
    with pytest.raises(InputError, match="loss_mask must be 0/1"):
        load_tokenized(tmp_path / "mask.parquet")
    pq.write_table(pa.table({"id": ["x"], "tokens": [[1, 2]]}), tmp_path / "cols.parquet")
    with pytest.raises(InputError, match="missing column"):
        load_tokenized(tmp_path / "cols.parquet")
    with pytest.raises(InputError, match="not found"):
        load_tokenized(tmp_path / "nowhere")
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="holds no .parquet, .arrow or datasets files"):
        load_tokenized(tmp_path / "empty")


def test_audit_checks_the_split_train_trains_on(tmp_path):
    import datasets

    from draftsmith.audit import audit_tokenized

    splits = {"train": ROWS[:2], "test": ROWS[2:]}
    datasets.DatasetDict({name: datasets.Dataset.from_list(rows) for name, rows in splits.items()}).save_to_disk(
        str(tmp_path / "dd")
    )
    assert [sample.id for sample in load_tokenized(tmp_path / "dd")] == ["a", "b"]
    assert audit_tokenized(tmp_path / "dd").samples == 2
    assert [sample.id for sample in load_tokenized(tmp_path / "dd", split="test")] == ["c"]
    assert audit_tokenized(tmp_path / "dd", split="test").samples == 1
