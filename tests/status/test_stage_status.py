"""`draftsmith status` on a real tokenize output (written from real generate rows) and a real export."""

from __future__ import annotations

import subprocess
import sys

import torch

from draftsmith.generate import GenerateConfig, generate
from draftsmith.serve.process import ServeProcess

from .conftest import environment, run_status


def test_a_finished_tokenize_and_export(tmp_path, prompts_file, tiny_target_dir):
    from draftsmith.export.exporter import export_drafter
    from draftsmith.model import DFlashDraftModel, build_drafter_config, save_drafter
    from draftsmith.model.target import load_target_config

    prompts, generated, tokenized = prompts_file(12), tmp_path / "gen", tmp_path / "tok"
    with ServeProcess() as server:
        generate(GenerateConfig(inputs=[prompts], output_dir=generated, endpoints=[server.url], progress=False,
                                return_token_ids=False))  # the echo server's ids are not the tiny target's
    done = subprocess.run([sys.executable, "-m", "draftsmith", "tokenize", str(generated), "-t", str(tiny_target_dir),
                           "-o", str(tokenized), "--workers", "1", "--no-progress", "--no-audit"],
                          env=environment(), capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    code, view, _ = run_status(tokenized)
    assert (code, view["stage"], view["state"], view["done"], view["writer_alive"]) == (0, "tokenize", "finished", 12, False)

    torch.manual_seed(0)
    config = build_drafter_config(load_target_config(tiny_target_dir), num_draft_layers=1, block_size=4, mask_token_id=3)
    drafter = save_drafter(DFlashDraftModel(config), tmp_path / "drafter")
    export_drafter(drafter, tmp_path / "export", check_reference=False)
    code, view, _ = run_status(tmp_path / "export")
    assert (code, view["stage"], view["state"]) == (0, "export", "finished")
    code, _, stderr = run_status(tokenized, tmp_path / "export")  # two stages at once: one line, exit 2
    assert code == 2 and "belong to different stages" in stderr
