"""`eval` on a DSpark drafter: its report says dspark (JSON included) with the drafter's block, and a
drafter whose weights do not fit its config or the target is one line (exit 2), not torch's dump."""

from __future__ import annotations

import json

import pytest
import torch

from draftsmith.cli import main
from draftsmith.export.exporter import export_drafter
from draftsmith.model import build_drafter_config
from draftsmith.model.dspark import DSparkDraftModel, build_dspark_config


@pytest.fixture(scope="module")
def dspark_dir(target, tmp_path_factory):
    config = build_dspark_config(build_drafter_config(target.config, num_draft_layers=1, block_size=4, mask_token_id=3),
                                 markov_rank=8, confidence_head=True)
    torch.manual_seed(0)
    return export_drafter(DSparkDraftModel(config).eval(), tmp_path_factory.mktemp("dspark") / "export",
                          check_reference=False).path


def _eval(capsys, tiny_target_dir, drafter, prompts, *extra) -> tuple[int, str, str]:
    code = main(["eval", "--target", str(tiny_target_dir), "--drafter", str(drafter), "--prompts", str(prompts),
                 "--max-new-tokens", "8", "--limit", "2", *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_eval_json_of_a_dspark_drafter_says_dspark_with_its_block(dspark_dir, tiny_target_dir, prompts_file, capsys):
    code, out, err = _eval(capsys, tiny_target_dir, dspark_dir, prompts_file(2), "--json")
    assert code in (0, 1), err
    report = json.loads(out)
    assert report["method"] == "dspark" and report["block_size"] == 4 and report["verify_tokens"] == 5
    assert len(report["per_position_acceptance"]) == 4  # B drafts per cycle


def test_a_markov_rank_edited_after_export_is_one_line(dspark_dir, tiny_target_dir, prompts_file, tmp_path, capsys):
    import shutil

    broken = shutil.copytree(dspark_dir, tmp_path / "broken")
    config = json.loads((broken / "config.json").read_text())
    (broken / "config.json").write_text(json.dumps({**config, "markov_rank": 4}))
    code, out, err = _eval(capsys, tiny_target_dir, broken, prompts_file(2))
    lines = err.strip().splitlines()
    assert code == 2 and out == "" and "Traceback" not in err, err
    # The first of the three tensors the rank shapes (confidence head, both Markov matrices), and the count.
    assert "confidence_head.proj.weight has shape [1, 136], config.json makes it [1, 132] (and 2 more)" in lines[-1]
    assert "size mismatch" not in err and "state_dict" not in err
