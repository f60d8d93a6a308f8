"""The one safetensors header check every weight reader goes through (issue 27.6)."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from draftsmith.core.errors import InputError
from draftsmith.model.safetensors_file import read_safetensors_header


def _rewrite(path, change):
    raw = path.read_bytes()
    length = struct.unpack("<Q", raw[:8])[0]
    header = change(json.loads(raw[8 : 8 + length]))
    encoded = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + raw[8 + length :])


def _entry(name, key, value):
    def change(header):
        header[name][key] = value
        return header

    return change


@pytest.fixture
def weights(tmp_path):
    path = tmp_path / "model.safetensors"
    save_file({"a": torch.zeros(4, 2), "b": torch.ones(3)}, str(path), metadata={"format": "pt"})
    return path


def test_a_good_file_passes_with_its_spans(weights):
    header = read_safetensors_header(weights)
    assert sorted(header.tensors) == ["a", "b"] and header.metadata == {"format": "pt"}
    assert header.spans() == [(0, 32), (32, 44)]


@pytest.mark.parametrize("change, problem", [
    (_entry("a", "data_offsets", [0, 10**12]), "needs 32 bytes"),
    (_entry("a", "data_offsets", [-4, 28]), "are not two byte offsets"),
    (_entry("a", "shape", [8, 2]), "needs 64 bytes"),
    (_entry("a", "dtype", "F33"), "unknown dtype"),
    (_entry("b", "data_offsets", [28, 40]), "overlap another tensor"),
    (lambda header: [1, 2], "header is not a JSON object"),
])  # fmt: skip
def test_bad_offsets_sizes_or_layout_are_one_line_naming_the_file(weights, change, problem):
    _rewrite(weights, change)
    with pytest.raises(InputError, match=f"^{weights}: not a readable safetensors file.*{problem}"):
        read_safetensors_header(weights)


def test_a_cut_short_or_missing_file_is_named(weights):
    weights.write_bytes(weights.read_bytes()[:-4])
    with pytest.raises(InputError, match="the file has"):
        read_safetensors_header(weights)
    weights.write_bytes(b"\x01\x02")
    with pytest.raises(InputError, match="shorter than the 8-byte header length"):
        read_safetensors_header(weights)
    weights.unlink()
    with pytest.raises(InputError, match=f"^{weights}: missing"):
        read_safetensors_header(weights)
