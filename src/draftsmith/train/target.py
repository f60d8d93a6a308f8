"""The frozen parts of the target the drafter borrows: the whole model (online) or just its
embedding and LM head (offline, where loading a large target for two matrices would be wasteful)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import nn

from draftsmith.core.errors import InputError
from draftsmith.core.paths import require_dir

EMBED_KEYS = ("model.embed_tokens.weight", "embed_tokens.weight", "model.language_model.embed_tokens.weight")
HEAD_KEYS = ("lm_head.weight",)


def load_target_config(target_dir: Path):
    from transformers import AutoConfig

    require_dir(target_dir, "--target")
    if not (Path(target_dir) / "config.json").exists():
        raise InputError(f"{target_dir}: no config.json; --target must be a Hugging Face model directory")
    return AutoConfig.from_pretrained(target_dir)


def load_target_model(target_dir: Path, device: torch.device, dtype: torch.dtype = torch.float32) -> nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype)
    model.to(device).eval()
    model.requires_grad_(False)
    return model


def _weight_files(target_dir: Path) -> dict[str, Path]:
    """Map tensor name -> safetensors file for a (possibly sharded) checkpoint."""
    index = target_dir / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return {name: target_dir / file for name, file in weight_map.items()}
    single = target_dir / "model.safetensors"
    if single.exists():
        from safetensors import safe_open

        with safe_open(str(single), framework="pt") as handle:
            return {name: single for name in handle.keys()}
    return {}


def load_embedding_and_head(target_dir: Path, device: torch.device, dtype: torch.dtype = torch.float32) -> tuple[nn.Embedding, nn.Linear]:
    """Frozen `embed_tokens` and `lm_head` read straight from the target's safetensors."""
    from safetensors import safe_open

    target_dir = Path(target_dir)
    config = load_target_config(target_dir)
    files = _weight_files(target_dir)

    def read(keys: tuple[str, ...]) -> torch.Tensor | None:
        for key in keys:
            if key in files:
                with safe_open(str(files[key]), framework="pt") as handle:
                    return handle.get_tensor(key)
        return None

    embed_weight = read(EMBED_KEYS)
    head_weight = read(HEAD_KEYS)
    if embed_weight is None or (head_weight is None and not getattr(config, "tie_word_embeddings", False)):
        # Unusual layouts: let transformers resolve the names, then keep only the two modules.
        model = load_target_model(target_dir, torch.device("cpu"), dtype)
        embed_weight = model.get_input_embeddings().weight.detach().clone()
        head = model.get_output_embeddings()
        head_weight = head.weight.detach().clone()
        del model
    if head_weight is None:
        head_weight = embed_weight
    embedding = nn.Embedding.from_pretrained(embed_weight.to(dtype), freeze=True).to(device)
    head = nn.Linear(head_weight.shape[1], head_weight.shape[0], bias=False)
    head.weight = nn.Parameter(head_weight.to(dtype), requires_grad=False)
    return embedding, head.to(device)
