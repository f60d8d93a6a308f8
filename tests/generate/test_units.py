"""Prompt reading, reasoning extraction, the store's resume index and the quality guard."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftsmith.core.errors import InputError
from draftsmith.generate.guard import GuardConfig, QualityGuard
from draftsmith.data.conversation import content_hash_id
from draftsmith.data.prompts import load_prompts
from draftsmith.generate.inputs import shard_of
from draftsmith.data.reasoning import extract_reasoning, split_think
from draftsmith.generate.store import OutputStore, scan_done_ids


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


# --- inputs -------------------------------------------------------------------------------------


def test_jsonl_sharegpt_parquet_and_dataset_dirs(tmp_path):
    rows = [
        {"id": 7, "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "old answer"}]},
        {"conversations": [{"from": "system", "value": "s"}, {"from": "human", "value": "b"}]},
    ]
    samples, duplicates = load_prompts(write_jsonl(tmp_path / "p.jsonl", rows))
    assert [s.id for s in samples] == ["7", content_hash_id([{"role": "system", "content": "s"}, {"role": "user", "content": "b"}])]
    assert samples[0].messages == [{"role": "user", "content": "a"}]  # the old final answer is dropped
    assert samples[1].messages[1] == {"role": "user", "content": "b"} and duplicates == []

    table = pa.Table.from_pylist([{"id": "x", "messages": [{"role": "user", "content": "c"}]}])
    pq.write_table(table, tmp_path / "p.parquet")
    assert load_prompts(tmp_path / "p.parquet")[0][0].messages == [{"role": "user", "content": "c"}]

    import datasets

    datasets.Dataset.from_list([{"id": "y", "messages": [{"role": "user", "content": "d"}]}]).save_to_disk(tmp_path / "ds")
    assert load_prompts(tmp_path / "ds")[0][0].id == "y"


def test_content_hash_is_stable_and_duplicates_are_counted(tmp_path):
    row = {"messages": [{"role": "user", "content": "same"}]}
    samples, duplicates = load_prompts(write_jsonl(tmp_path / "p.jsonl", [row, row]))
    assert len(samples) == 1 and duplicates == [samples[0].id]
    assert samples[0].id == load_prompts(write_jsonl(tmp_path / "q.jsonl", [row]))[0][0].id


@pytest.mark.parametrize(
    "line, message",
    [
        ("{bad json", "invalid JSON"),
        (json.dumps({"text": "x"}), "neither 'messages' nor 'conversations'"),
        (json.dumps({"messages": [{"role": "wizard", "content": "x"}]}), "unknown speaker 'wizard'"),
        (json.dumps({"messages": [{"role": "system", "content": "x"}]}), "must end with a user"),
    ],
)
def test_bad_rows_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"messages": [{"role": "user", "content": "ok"}]}) + "\n" + line + "\n")
    with pytest.raises(InputError, match=message) as error:
        load_prompts(path)
    assert f"{path}:2" in str(error.value)


def test_conflicting_ids_are_an_error(tmp_path):
    rows = [{"id": "a", "messages": [{"role": "user", "content": "x"}]},
            {"id": "a", "messages": [{"role": "user", "content": "y"}]}]
    with pytest.raises(InputError, match="already used by a different prompt"):
        load_prompts(write_jsonl(tmp_path / "p.jsonl", rows))


def test_shards_are_disjoint_and_complete():
    ids = [f"sample-{i}" for i in range(1000)]
    shards = [{i for i in ids if shard_of(i, 4) == k} for k in range(4)]
    assert set().union(*shards) == set(ids) and sum(map(len, shards)) == 1000
    assert all(150 < len(shard) < 350 for shard in shards)


# --- reasoning ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "message, expected",
    [
        ({"content": "\n\nAnswer.", "reasoning_content": "\nThink.\n"}, ("Think.", "Answer.", "reasoning_content")),
        ({"content": "\n\nAnswer.", "reasoning": "Think."}, ("Think.", "Answer.", "reasoning")),
        ({"content": "<think>\nThink.\n</think>\n\nAnswer."}, ("Think.", "Answer.", "inline")),
        ({"content": "Think.\n</think>\n\nAnswer."}, ("Think.", "Answer.", "inline")),  # template pre-filled <think>
        ({"content": "<think>\ncut off mid-thought"}, ("cut off mid-thought", "", "inline")),
        ({"content": "Just an answer.", "reasoning_content": None}, ("", "Just an answer.", "none")),
    ],
)
def test_extract_reasoning(message, expected):
    assert extract_reasoning(message) == expected


def test_split_think_keeps_whitespace():
    assert split_think("<think>\na\n</think>\n\nb") == ("\na\n", "\n\nb")


# --- store --------------------------------------------------------------------------------------


def test_store_drops_duplicates_and_repairs_torn_tail(tmp_path):
    store = OutputStore(tmp_path, 0, 1)
    store.scan()
    assert store.write_row({"id": "a", "messages": []})
    assert not store.write_row({"id": "a", "messages": []})
    store.write_row({"id": "b", "messages": []})
    store.close()
    path = store.rows_path
    with path.open("a") as handle:  # a crash in the middle of writing row "c"
        handle.write('{"id": "c", "messages": [{"ro')
    assert scan_done_ids(tmp_path) == {"a", "b"}
    assert path.read_text().endswith("\n") and len(path.read_text().splitlines()) == 2
    second = OutputStore(tmp_path, 0, 1)
    assert second.scan() == {"a", "b"}
    assert not second.write_row({"id": "b", "messages": []})
    second.write_row({"id": "c", "messages": []})
    second.close()
    assert second.rows_path != path  # every run appends to its own new part
    assert scan_done_ids(tmp_path) == {"a", "b", "c"}


def test_store_rejects_a_corrupt_middle_line(tmp_path):
    (tmp_path / "generated-s0of1-00000.jsonl").write_text('{"id": "a"}\nnot json\n{"id": "b"}\n')
    with pytest.raises(InputError, match="generated-s0of1-00000.jsonl:2"):
        scan_done_ids(tmp_path)


# --- guard --------------------------------------------------------------------------------------


def test_guard_trips_on_boilerplate_only_after_min_samples():
    guard = QualityGuard(GuardConfig(window=100, min_samples=20, max_boilerplate=0.5))
    trips = [guard.observe("OK.", "", "stop") if i % 10 else guard.observe(f"answer {i}", "r", "stop") for i in range(19)]
    assert trips == [None] * 19
    trip = guard.observe("ok. ", "", "stop")
    assert trip is not None and trip.check in ("boilerplate", "empty_reasoning")


def test_guard_checks_each_signal():
    def run(config, answer, reasoning, finish):
        guard = QualityGuard(config)
        for i in range(60):
            trip = guard.observe(answer.format(i=i), reasoning, finish)
            if trip:
                return trip.check
        return None

    base = GuardConfig(min_samples=50)
    assert run(base, "answer {i}", "thinking", "stop") is None
    assert run(base, "", "thinking", "stop") == "empty_answer"
    assert run(base, "answer {i}", "", "stop") == "empty_reasoning"
    assert run(GuardConfig(min_samples=50, expect_reasoning=False), "answer {i}", "", "stop") is None
    assert run(base, "answer {i}", "thinking", "length") == "length"
    assert run(GuardConfig(enabled=False), "", "", "length") is None


def test_orders():
    from draftsmith.data.prompts import PromptSample
    from draftsmith.generate.pipeline import _order

    def sample(i, system, user):
        return PromptSample(str(i), [{"role": "system", "content": system}, {"role": "user", "content": user}], "x")

    samples = [sample(0, "B", "short"), sample(1, "A", "a much longer prompt"), sample(2, "B", "mid prompt"),
               sample(3, "A", "x")]
    assert [s.id for s in _order(samples, "input")] == ["0", "1", "2", "3"]
    assert [s.id for s in _order(samples, "longest-first")] == ["1", "2", "0", "3"]
    prefix = [s.messages[0]["content"] for s in _order(samples, "prefix")]
    assert prefix == ["A", "A", "B", "B"]  # shared system prompts adjacent for prefix caching
