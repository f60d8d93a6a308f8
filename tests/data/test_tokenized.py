import json
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftsmith.core.errors import InputError
from draftsmith.data.tokenized import META_KEY, SCHEMA, load_tokenized, write_tokenized


@pytest.fixture(autouse=True)
def private_cache(tmp_path, monkeypatch):
    """Conversions of foreign files go to this test's own cache."""
    monkeypatch.setenv("DRAFTSMITH_CACHE", str(tmp_path / "cache"))

ROWS = [
    {"id": "a", "input_ids": [1, 2, 3, 4], "loss_mask": [0, 0, 1, 1]},
    {"id": "b", "input_ids": [5, 6, 7], "loss_mask": [0, 1, 1]},
    {"id": "c", "input_ids": [8, 9, 10, 11, 12], "loss_mask": [0, 1, 1, 1, 1]},
]


def test_arrow_shards_roundtrip_in_order_memory_mapped(tmp_path):
    paths = write_tokenized(ROWS, tmp_path / "tok", shard_rows=2)
    assert [path.name for path in paths] == ["part-00000.arrow", "part-00001.arrow"]
    dataset = load_tokenized(tmp_path / "tok")
    assert [sample.id for sample in dataset.samples] == ["a", "b", "c"]
    assert [sample.id for sample in dataset[1:]] == ["b", "c"] and dataset[-1].id == "c"
    assert dataset.total_tokens == 12 and dataset.total_trainable == 8 and dataset.max_token_id == 12
    assert dataset.lengths.tolist() == [4, 3, 5]
    with pa.memory_map(str(paths[0])) as source:
        reader = pa.ipc.open_file(source)  # uncompressed IPC file: what memory-maps
        table = reader.read_all()
        stats = json.loads(reader.schema.metadata[META_KEY])
    assert table.schema.equals(SCHEMA) and table.column("num_trainable").to_pylist() == [2, 2]
    assert (stats["rows"], stats["tokens"], stats["trainable"], stats["max_token_id"]) == (2, 7, 4, 7)
    sample = dataset[2]
    assert sample.input_ids.dtype == np.int32 and sample.loss_mask.dtype == np.int8
    assert sample.input_ids.base is not None  # a view into the mapped shard, not a copy
    assert (sample.num_tokens, sample.num_trainable) == (5, 4)
    truncated = load_tokenized(tmp_path / "tok", max_length=3)
    assert truncated[2].input_ids.tolist() == [8, 9, 10]
    assert truncated.total_tokens == 9 and truncated.total_trainable == 1 + 2 + 2
    assert truncated.trainable_pairs().tolist() == [0, 1, 1] and dataset.trainable_pairs().tolist() == [1, 1, 3]
    assert truncated.fingerprint() != dataset.fingerprint()
    assert load_tokenized(tmp_path / "tok").fingerprint() == dataset.fingerprint()


def test_fingerprint_follows_the_content_not_the_path(tmp_path):
    """Data rewritten at the same path (issue 17: 320 -> 20,000 rows) gives another fingerprint."""
    rows = [{"id": f"r{index}", "input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]} for index in range(320)]
    write_tokenized(rows, tmp_path / "tok")
    before = load_tokenized(tmp_path / "tok").fingerprint()
    changed = [dict(row) for row in rows]
    changed[7] = {"id": "r7", "input_ids": [1, 2, 4], "loss_mask": [0, 1, 1]}  # one token, same length
    for name in ("part-00000.arrow",):
        (tmp_path / "tok" / name).unlink()
    write_tokenized(changed, tmp_path / "tok")
    assert load_tokenized(tmp_path / "tok").fingerprint() != before
    grown = [{"id": f"r{index}", "input_ids": [1, 2, 3], "loss_mask": [0, 1, 1]} for index in range(20_000)]
    (tmp_path / "tok" / "part-00000.arrow").unlink()
    write_tokenized(grown, tmp_path / "tok", shard_rows=100_000)
    assert load_tokenized(tmp_path / "tok").fingerprint() not in (before,)


def test_parquet_shards_of_earlier_versions_load_converted_once(tmp_path, capsys):
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    for index, part in enumerate((ROWS[:2], ROWS[2:])):  # what draftsmith wrote before Arrow shards
        table = pa.table({key: [row[key] for row in part] for key in ("id", "input_ids", "loss_mask")})
        table = table.append_column("num_tokens", pa.array([len(row["input_ids"]) for row in part], pa.int32()))
        pq.write_table(table, legacy / f"part-{index:05d}.parquet", compression="zstd")
    dataset = load_tokenized(legacy)
    assert "not a draftsmith Arrow shard; checking and converting it once" in capsys.readouterr().err
    assert [sample.id for sample in dataset] == ["a", "b", "c"] and dataset[2].loss_mask.tolist() == [0, 1, 1, 1, 1]
    again = load_tokenized(legacy)
    assert capsys.readouterr().err == ""  # converted once
    native = load_tokenized(write_tokenized(ROWS, tmp_path / "native", shard_rows=2)[0].parent)
    assert again.fingerprint() == dataset.fingerprint() == native.fingerprint()


def test_loading_builds_nothing_per_sample(tmp_path):
    """Start-up must not grow with the sample count: no Python object or array per sample."""
    count = 20_000
    flat = np.arange(count * 8, dtype=np.int32) % 1000
    write_tokenized(
        ({"id": f"s{index}", "input_ids": flat[index * 8 : index * 8 + 8], "loss_mask": [0, 0, 1, 1, 1, 1, 1, 1]}
         for index in range(count)),
        tmp_path / "tok", shard_rows=5_000,
    )  # fmt: skip
    tracemalloc.start()
    dataset = load_tokenized(tmp_path / "tok", max_length=6)
    totals = (len(dataset), dataset.total_tokens, dataset.total_trainable, dataset.fingerprint())
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert totals[:3] == (count, count * 6, count * 4)
    assert peak < 1_500_000, f"{peak:,} bytes traced while loading {count:,} samples"
    assert dataset[12_345].input_ids.tolist() == flat[12_345 * 8 : 12_345 * 8 + 6].tolist()


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
    with pytest.raises(InputError, match=r"row 1 \(id broken\): input_ids has 3 tokens but loss_mask has 2"):
        write_tokenized(bad, tmp_path / "refused")  # the writer checks rows too
    write_tokenized([ROWS[0], {**ROWS[1], "id": "a"}], tmp_path / "twice")
    with pytest.raises(InputError, match=r"part-00000.arrow: row 1 \(id a\): duplicate id, first seen in .*row 0"):
        load_tokenized(tmp_path / "twice")
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


def _values_offset(shard, column):
    with pa.memory_map(str(shard), "r") as source:
        buffer = source.read_buffer()
        values = pa.ipc.open_file(buffer).get_batch(0).column(column).values
        return values.buffers()[1].address - buffer.address


@pytest.mark.parametrize("damage", ["token", "mask", "truncated"])
def test_a_damaged_shard_is_refused_on_open_naming_it(tmp_path, damage):
    """What the writer recorded (sha256, counts, largest id) is recomputed when a shard is opened;
    a change made after a first, clean load is caught too (nothing trusted from then on)."""
    import time

    rows = [{"id": f"r{index}", "input_ids": [5, 6, 7, 8], "loss_mask": [0, 0, 1, 1]} for index in range(6)]
    shard = write_tokenized(rows, tmp_path / "tok", shard_rows=3)[1]
    assert len(load_tokenized(tmp_path / "tok")) == 6
    time.sleep(0.05)  # a later change, as bit rot or a bad copy makes it
    if damage == "truncated":
        with shard.open("r+b") as handle:
            handle.truncate(shard.stat().st_size - 40)
    else:
        column, value = ("input_ids", (6).to_bytes(4, "little")) if damage == "token" else ("loss_mask", b"\x00")
        with shard.open("r+b") as handle:
            handle.seek(_values_offset(shard, column) + (4 * 2 if damage == "token" else 3))
            handle.write(value)
    with pytest.raises(InputError) as error:
        load_tokenized(tmp_path / "tok")
    message = str(error.value)
    damaged = "not an Arrow IPC file" if damage == "truncated" else "a damaged tokenized shard"
    assert message.startswith(f"{shard}: {damaged}") and "\n" not in message, message
