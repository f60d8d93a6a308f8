"""`check` on an export whose drafter owns its mask embedding: mask_embedding.pt must match the config."""

from __future__ import annotations

import shutil

import pytest
import torch

from draftsmith.cli import main
from draftsmith.tiny.families import build_family_target


@pytest.fixture(scope="module")
def nopad_export(tmp_path_factory):
    """The export of a 3-step run on a target with no spare id (the drafter_embedding fallback)."""
    from draftsmith.gates.overfit import prepare_overfit

    root = tmp_path_factory.mktemp("nopad-check")
    target = build_family_target("mistral-nopad", root / "target")
    prepared = prepare_overfit(target, root / "run", samples=1, steps=3, max_new_tokens=12)
    return target, prepared.export_dir


def _check(capsys, export, target) -> tuple[int, str]:
    code = main(["check", str(export), "--target", str(target), "--no-parity"])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def _plant(export, **changes):
    saved = torch.load(export / "mask_embedding.pt", weights_only=True)
    saved.update(changes)
    torch.save(saved, export / "mask_embedding.pt")


PLANTED = {
    "wrong id": (lambda e: _plant(e, mask_token_id=5), "mask_embedding.pt mask_token_id"),
    "wrong shape": (lambda e: _plant(e, embedding=torch.zeros(32)), "mask_embedding.pt embedding shape"),
    "missing file": (lambda e: (e / "mask_embedding.pt").unlink(), "mask_embedding.pt"),
    "not a torch file": (lambda e: (e / "mask_embedding.pt").write_bytes(b"not a pickle"), "mask_embedding.pt"),
}


def test_the_clean_export_passes(nopad_export, capsys):
    target, export = nopad_export
    code, output = _check(capsys, export, target)
    assert code == 0, output


@pytest.mark.parametrize("fault", list(PLANTED))
def test_a_mask_embedding_mismatch_is_named(fault, nopad_export, tmp_path, capsys):
    target, export = nopad_export
    copy = shutil.copytree(export, tmp_path / "export")
    plant, field = PLANTED[fault]
    plant(copy)
    code, output = _check(capsys, copy, target)
    assert code == 1, output
    assert f"error: {field}: is " in output, output


def test_a_mask_embedding_the_drafter_was_not_trained_with_is_an_error(small_demo, tiny_target_dir, tmp_path, capsys):
    import json

    copy = shutil.copytree(small_demo.export_dir, tmp_path / "export")
    hidden = json.loads((copy / "config.json").read_text())["hidden_size"]
    mask = json.loads((copy / "config.json").read_text())["dflash_config"]["mask_token_id"]
    torch.save({"mask_token_id": mask, "embedding": torch.zeros(hidden)}, copy / "mask_embedding.pt")
    code = main(["check", str(copy), "--target", str(tiny_target_dir), "--no-parity"])
    output = capsys.readouterr()
    assert code == 1, output.out + output.err
    assert "error: dflash_config.mask_token_source" in output.out + output.err
