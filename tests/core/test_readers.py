"""The shared readers (`draftsmith.core.readers`): what sits at a file's name is read only when it is
a regular file of bounded size, and JSON only when it nests no deeper than the limit -- for every
file that goes through them (a model's config.json, the owner record, a manifest, a progress record)."""

from __future__ import annotations

import json
import os
import threading

import pytest

from draftsmith.core.errors import InputError
from draftsmith.core.io import read_json_file, temporary_name, write_atomic
from draftsmith.core.lock import OWNER_NAME, directory_owner
from draftsmith.core.manifest import read_manifest
from draftsmith.core.paths import NAME_MAX, require_utf8_path, sibling_name
from draftsmith.core.readers import BadJSONError, json_depth, loads_json, read_json
from draftsmith.data.run_records import read_progress
from draftsmith.model.shape import read_model_config

DEEP = "[" * 100_000 + "]" * 100_000


def _finishes(call, seconds: float = 10):
    """Run `call` in a thread: (finished in time, its outcome); a read that blocks never finishes."""
    outcome: list = []

    def run():
        try:
            outcome.append(call())
        except BaseException as error:  # noqa: BLE001 - the outcome is what the test looks at
            outcome.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(seconds)
    return not thread.is_alive(), (outcome or [None])[0]


def test_a_fifo_a_device_and_an_oversized_file_are_one_line_each(tmp_path):
    os.mkfifo(tmp_path / "fifo.json")
    finished, outcome = _finishes(lambda: read_json(tmp_path / "fifo.json"))
    assert finished and isinstance(outcome, InputError) and "not a regular file (a FIFO)" in str(outcome)
    os.symlink("/dev/zero", tmp_path / "zero.json")
    finished, outcome = _finishes(lambda: read_json(tmp_path / "zero.json"))
    assert finished and isinstance(outcome, InputError) and "a character device" in str(outcome)
    (tmp_path / "big.json").write_text("[" + "1," * 600 + "1]")
    with pytest.raises(InputError, match="larger than 1,000 bytes"):
        read_json(tmp_path / "big.json", max_bytes=1000)
    with pytest.raises(InputError, match="no such bench file"):
        read_json(tmp_path / "absent.json", "bench file")
    assert read_json(tmp_path / "absent.json", missing_ok=True) is None
    (tmp_path / "link.json").symlink_to(tmp_path / "plain.json")
    (tmp_path / "plain.json").write_text('{"a": 1}')
    assert read_json(tmp_path / "link.json") == {"a": 1}  # a link to a plain file is that file


def test_the_depth_limit_counts_brackets_outside_strings_only():
    assert json_depth(b'{"a": "[[[[{{", "b": [[1], [2, {"c": []}]]}') == 5
    assert loads_json('{"text": "' + "[" * 5000 + '"}', "x") == {"text": "[" * 5000}
    assert loads_json("[" * 100 + "]" * 100, "x") == json.loads("[" * 100 + "]" * 100)
    with pytest.raises(BadJSONError, match="nested 101 levels deep"):
        loads_json("[" * 101 + "]" * 101, "x")
    with pytest.raises(BadJSONError, match=r"x:2: invalid JSON"):
        loads_json('{\n"a": }', "x")


@pytest.mark.parametrize("name", ["config.json", OWNER_NAME, "manifest.json", "progress-s0of1.json"])
def test_json_nested_100000_deep_is_one_line_in_every_reader(tmp_path, name, capsys):
    """Each of these was a RecursionError traceback (issue 34 item 8)."""
    (tmp_path / name).write_text(DEEP)
    if name == "config.json":  # plan engine's and the model readers' config.json
        with pytest.raises(InputError, match="nested 100,000 levels deep"):
            read_model_config(tmp_path)
    elif name == OWNER_NAME:  # an owner record is a few bytes: this one is refused by its size first
        with pytest.raises(InputError, match=f"{OWNER_NAME}: larger than 4,096 bytes"):
            directory_owner(tmp_path)
        (tmp_path / name).write_text("[" * 2000 + "]" * 2000)  # small, and still past Python's recursion limit
        with pytest.raises(InputError, match="nested 2,000 levels deep.*unreadable owner record"):
            directory_owner(tmp_path)
    elif name == "manifest.json":
        with pytest.raises(InputError, match="nested 100,000 levels deep"):
            read_manifest(tmp_path)
    else:  # the record only saves re-reading rows: ignored, said in one line
        assert read_progress(tmp_path / name) is None
        err = capsys.readouterr().err
        assert "nested 100,000 levels deep" in err and len(err.strip().splitlines()) == 1


def test_every_json_reader_refuses_a_fifo_without_blocking(tmp_path):
    os.mkfifo(tmp_path / OWNER_NAME)
    os.mkfifo(tmp_path / "manifest.json")
    for call in (lambda: directory_owner(tmp_path), lambda: read_manifest(tmp_path),
                 lambda: read_json_file(tmp_path / "manifest.json", "run manifest")):  # fmt: skip
        finished, outcome = _finishes(call)
        assert finished and isinstance(outcome, InputError) and "FIFO" in str(outcome)


def test_helper_names_of_a_name_near_the_length_limit_fit_and_stay_its_own(tmp_path):
    long_a, long_b = "a" * 250, "a" * 249 + "b"
    for name in (long_a, long_b):
        for suffix in (".draftsmith.lock", ".partial", ".tmp"):
            helper = sibling_name(tmp_path / name, ".", suffix)
            assert len(os.fsencode(helper.name)) <= NAME_MAX and helper.name.endswith(suffix)
            helper.touch()  # the file system takes it
    assert sibling_name(tmp_path / long_a, ".", ".tmp") != sibling_name(tmp_path / long_b, ".", ".tmp")
    assert sibling_name(tmp_path / "short", ".", ".tmp") == tmp_path / ".short.tmp"
    assert temporary_name(tmp_path / long_a) == sibling_name(tmp_path / long_a, ".", ".tmp")
    write_atomic(tmp_path / ("c" * 255), "whole")  # its temporary fits too
    assert (tmp_path / ("c" * 255)).read_text() == "whole"


def test_a_path_that_is_not_utf8_is_named_before_anything_is_made(tmp_path):
    bad = os.fsdecode(os.fsencode(tmp_path) + b"/caf\xe9")
    with pytest.raises(InputError, match=r"--out .*not UTF-8 \(b'\\xe9'\)"):
        require_utf8_path(bad, "--out")
    assert require_utf8_path(tmp_path / "café", "--out") == tmp_path / "café"
