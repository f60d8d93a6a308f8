"""Atomic writes: the old content or the whole new one, never a torn file, no temporaries left."""

from __future__ import annotations

import json

import pytest

from draftsmith.core.io import atomic_path, publish, write_atomic, write_json_atomic


def test_write_replaces_whole_files_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "summary.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2} and path.read_text().endswith("\n")
    write_atomic(tmp_path / "b.bin", b"\x00\x01")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b.bin", "summary.json"]


def test_a_failed_write_keeps_the_old_file(tmp_path):
    path = tmp_path / "data.txt"
    path.write_text("old")
    with pytest.raises(RuntimeError):
        with atomic_path(path) as temporary:
            temporary.write_text("half of the new")
            raise RuntimeError("writer died")
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["data.txt"]


def test_publish_moves_a_finished_directory_into_place(tmp_path):
    staging = tmp_path / ".model.partial"
    (staging / "sub").mkdir(parents=True)
    (staging / "sub" / "w.bin").write_bytes(b"w")
    publish(staging, tmp_path / "model")
    assert (tmp_path / "model" / "sub" / "w.bin").read_bytes() == b"w" and not staging.exists()
