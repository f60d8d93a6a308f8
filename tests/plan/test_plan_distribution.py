import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftsmith.core.errors import InputError
from draftsmith.plan.distribution import load_lengths, summarize_lengths


def test_truncation_and_tail_by_hand():
    stats = summarize_lengths([100, 200, 300, 400, 5000], max_tokens=1000)
    # capped: 100, 200, 300, 400, 1000 -> total 2000 of the 6000 observed
    assert stats.mean == 400
    assert stats.mean_before_cap == 1200
    assert stats.share_at_cap == pytest.approx(0.2)
    assert stats.tokens_cut_share == pytest.approx(1 - 2000 / 6000)
    assert stats.max == 1000
    assert stats.p50 == 300
    assert stats.p90 == pytest.approx(400 + 0.6 * 600)  # linear interpolation at rank 3.6
    assert stats.p99 == pytest.approx(400 + 0.96 * 600)
    # longest 10% of 5 samples = 1 sample (rounded up) = 1000 of 2000 tokens
    assert stats.tail_token_share == pytest.approx(0.5)


def test_long_tail_share_of_a_thinking_like_distribution():
    lengths = [1000] * 90 + [10_000] * 10
    stats = summarize_lengths(lengths)
    assert stats.tail_token_share == pytest.approx(100_000 / 190_000)
    assert stats.share_at_cap is None
    capped = summarize_lengths(lengths, max_tokens=4000)
    assert capped.share_at_cap == pytest.approx(0.10)
    assert capped.mean == pytest.approx((90 * 1000 + 10 * 4000) / 100)
    assert capped.tail_token_share == pytest.approx(40_000 / 130_000)


def test_bad_distributions():
    with pytest.raises(InputError, match="empty"):
        summarize_lengths([])
    with pytest.raises(InputError, match="#2 is negative"):
        summarize_lengths([5, -1])
    with pytest.raises(InputError, match="max_tokens"):
        summarize_lengths([5], max_tokens=0)


def test_jsonl_field_with_nulls_and_dotted_paths(tmp_path):
    path = tmp_path / "pilot.jsonl"
    rows = [
        {"id": "a", "completion_tokens": 10, "usage": {"completion_tokens": 11}},
        {"id": "b", "completion_tokens": None, "usage": {"completion_tokens": 12}},
        {"id": "c", "completion_tokens": 30, "usage": {"completion_tokens": 13}},
    ]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n\n")
    assert load_lengths(f"{path}:completion_tokens").tolist() == [10, 30]
    assert load_lengths(f"{path}:usage.completion_tokens").tolist() == [11, 12, 13]


def test_jsonl_token_id_lists_count_their_length(tmp_path):
    path = tmp_path / "gen.jsonl"
    path.write_text(json.dumps({"id": "a", "completion_token_ids": [1, 2, 3]}) + "\n")
    assert load_lengths(f"{path}:completion_token_ids").tolist() == [3]


def test_jsonl_errors_name_the_line(tmp_path):
    path = tmp_path / "pilot.jsonl"
    path.write_text('{"completion_tokens": 5}\n{"completion_tokens": "many"}\n')
    with pytest.raises(InputError, match=r"pilot.jsonl line 2 field 'completion_tokens'"):
        load_lengths(f"{path}:completion_tokens")
    path.write_text('{"completion_tokens": 5}\n{oops\n')
    with pytest.raises(InputError, match=r"pilot.jsonl:2: invalid JSON"):
        load_lengths(f"{path}:completion_tokens")
    path.write_text('{"completion_tokens": 5}\n{"other": 1}\n')
    with pytest.raises(InputError, match="line 2: no field 'completion_tokens'"):
        load_lengths(f"{path}:completion_tokens")
    with pytest.raises(InputError, match="name the field"):
        load_lengths(path)


def test_parquet_numbers_lists_and_shard_directories(tmp_path):
    table = pa.table(
        {
            "completion_tokens": pa.array([100, None, 300], pa.int64()),
            "input_ids": pa.array([[1, 2], [3, 4, 5], [6]], pa.list_(pa.int32())),
        }
    )
    pq.write_table(table, tmp_path / "data.parquet")
    assert load_lengths(f"{tmp_path / 'data.parquet'}:completion_tokens").tolist() == [100, 300]
    assert load_lengths(f"{tmp_path / 'data.parquet'}:input_ids").tolist() == [2, 3, 1]
    with pytest.raises(InputError, match=r"no column 'nope' \(columns: completion_tokens, input_ids\)"):
        load_lengths(f"{tmp_path / 'data.parquet'}:nope")

    shards = tmp_path / "tokenized"
    shards.mkdir()
    for index, counts in enumerate(([5, 6], [7])):
        pq.write_table(pa.table({"num_tokens": pa.array(counts, pa.int32())}), shards / f"part-{index:05d}.parquet")
    assert sorted(load_lengths(shards).tolist()) == [5, 6, 7]  # num_tokens is found without naming it


def test_csv_and_text(tmp_path):
    csv_path = tmp_path / "lengths.csv"
    csv_path.write_text("id,completion_tokens\na,10\nb,20\n")
    assert load_lengths(f"{csv_path}:completion_tokens").tolist() == [10, 20]
    with pytest.raises(InputError, match="has 2 columns; name one"):
        load_lengths(csv_path)
    single = tmp_path / "single.csv"
    single.write_text("5\n6\n")
    assert load_lengths(single).tolist() == [5, 6]
    bad = tmp_path / "bad.csv"
    bad.write_text("n\n5\n-6\n")
    with pytest.raises(InputError, match=r"bad.csv:3: length must be a non-negative"):
        load_lengths(f"{bad}:n")

    text = tmp_path / "lengths.txt"
    text.write_text("# observed lengths\n100\n\n200  # a comment\n")
    assert load_lengths(text).tolist() == [100, 200]
    text.write_text("100\nabc\n")
    with pytest.raises(InputError, match=r"lengths.txt:2: 'abc' is not a number"):
        load_lengths(text)


def test_missing_file(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        load_lengths(f"{tmp_path / 'missing.parquet'}:completion_tokens")


def test_numpy_input():
    assert summarize_lengths(np.array([1, 2, 3])).count == 3
