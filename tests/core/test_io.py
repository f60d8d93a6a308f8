"""Atomic writes: the old content or the whole new one, never a torn file, no temporaries left."""

from __future__ import annotations

import json
import os
from pathlib import Path

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


def test_no_write_in_an_output_dir_follows_a_planted_link(tmp_path):
    """Issue 27.1: a link someone planted at a name draftsmith writes (a temporary, a staging dir, a
    lock, a log it appends to) is replaced or refused; the file or directory it points to is untouched."""
    from draftsmith.core.errors import InputError
    from draftsmith.core.io import fresh_dir, open_append, temporary_name
    from draftsmith.core.lock import LOCK_NAME, lock_directory

    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("keep\n")
    out = tmp_path / "out"
    out.mkdir()

    temporary_name(out / "summary.json").symlink_to(victim)
    write_json_atomic(out / "summary.json", {"a": 1})
    assert json.loads((out / "summary.json").read_text()) == {"a": 1} and not (out / "summary.json").is_symlink()

    (out / ".drafter.partial").symlink_to(elsewhere, target_is_directory=True)
    staging = fresh_dir(out / ".drafter.partial")
    assert staging.is_dir() and not staging.is_symlink() and not list(staging.iterdir())

    (out / LOCK_NAME).symlink_to(victim)
    with pytest.raises(InputError, match=f"{out / LOCK_NAME}: is a symbolic link"):
        with lock_directory(out, "tokenize"):
            pass
    (out / "train_log.jsonl").symlink_to(victim)
    with pytest.raises(InputError, match="train_log.jsonl: is a symbolic link"):
        open_append(out / "train_log.jsonl")
    assert victim.read_text() == "precious\n" and (elsewhere / "keep.txt").read_text() == "keep\n"


def test_a_full_disk_is_one_error_however_the_writing_library_reports_it(tmp_path):
    """Issue 27.4: safetensors raises SafetensorError and torch.save a RuntimeError on a full disk
    (their exact texts below); both are the one-line DiskFullError at the write, naming the file."""
    import errno

    from safetensors import SafetensorError

    from draftsmith.core.io import DiskFullError

    def safetensors_full():
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    def torch_save_full():  # torch.save into a Python file: the OSError is the RuntimeError's context
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError:
            raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534") from None

    for fail in (safetensors_full, torch_save_full):
        with pytest.raises(DiskFullError, match=f"^{tmp_path / 'w.bin'}: the disk is full"):
            with atomic_path(tmp_path / "w.bin") as temporary:
                temporary.write_bytes(b"half")
                fail()
        assert not list(tmp_path.iterdir())  # nothing half-written left
    with pytest.raises(RuntimeError, match="unrelated"):  # any other failure stays what it is
        with atomic_path(tmp_path / "w.bin"):
            raise RuntimeError("unrelated")


@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_what_is_published_follows_the_umask_however_it_was_written(tmp_path, mask):
    """Issue 32.6: mkstemp, mkdtemp and safetensors' own temporary file leave 0600/0700; a file the
    user gets must have what any new file gets under their umask."""
    import stat
    import tempfile

    import torch
    from safetensors.torch import save_file

    previous = os.umask(mask)
    try:
        with atomic_path(tmp_path / "weights.safetensors") as temporary:
            save_file({"w": torch.zeros(2)}, str(temporary))
        descriptor, name = tempfile.mkstemp(dir=tmp_path)
        os.close(descriptor)
        publish(name, tmp_path / "plain.bin")
        folder = Path(tempfile.mkdtemp(dir=tmp_path))
        (folder / "inner").mkdir(mode=0o700)
        descriptor, inner = tempfile.mkstemp(dir=folder / "inner")
        os.close(descriptor)
        publish(folder, tmp_path / "folder")
        write_atomic(tmp_path / "text.txt", "x")
    finally:
        os.umask(previous)
    for name in ("weights.safetensors", "plain.bin", "text.txt", f"folder/inner/{Path(inner).name}"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o666 & ~mask, name
    for name in ("folder", "folder/inner"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o777 & ~mask, name
