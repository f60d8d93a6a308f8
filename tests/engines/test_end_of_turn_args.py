"""llama-server is told the chat template's end of turn where it is not the GGUF's eos."""

from __future__ import annotations

import shutil

from draftsmith.engines.launch import end_of_turn_args
from draftsmith.tiny.families import build_family_target


def test_a_template_ending_turns_with_another_token_than_eos_names_it_as_the_eot_id(tmp_path, tiny_target_dir):
    from transformers import AutoTokenizer

    gemma = build_family_target("gemma3-gguf", tmp_path / "gemma")
    turn_end = AutoTokenizer.from_pretrained(gemma).convert_tokens_to_ids("<end_of_turn>")
    assert end_of_turn_args(gemma) == ["--override-kv", f"tokenizer.ggml.eot_token_id=int:{turn_end}"]
    # A fetched model's GGUF finds its folder beside it, in `hf`.
    fetched = tmp_path / "fetched"
    shutil.copytree(gemma, fetched / "hf")
    (fetched / "model.gguf").write_bytes(b"GGUF")
    assert end_of_turn_args(fetched / "model.gguf") == end_of_turn_args(gemma)
    # The tiny Qwen3 target ends turns with its eos (<|im_end|>): nothing to add; nor without a folder.
    assert end_of_turn_args(tiny_target_dir) == []
    assert end_of_turn_args(tmp_path / "lonely.gguf") == []
