"""Drafter checkpoints: config.json + model.safetensors in the format serving engines load.

Nothing else goes into the directory's weights: no embedding, no lm_head, no rotary buffers. A
drafter with its own mask vector (`dflash_config.mask_token_source == "drafter_embedding"`) adds
`mask_embedding.pt`, the file vLLM's DFlash loader (qwen3_dflash.py `_read_mask_embedding`) reads
from the drafter directory: `torch.save({"mask_token_id": int, "embedding": [hidden_size]})`.
Writes go to temporary names first and are renamed into place, so an interrupted save never
leaves a half-written checkpoint that looks complete.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save_file

from draftsmith.core.errors import InputError
from draftsmith.core.readers import read_json
from draftsmith.core.io import atomic_path, write_atomic
from draftsmith.model.config import DSPARK_ARCHITECTURE, DFlashConfig
from draftsmith.model.drafter import DFlashDraftModel
from draftsmith.model.safetensors_file import read_safetensors_header

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
MASK_EMBEDDING_NAME = "mask_embedding.pt"
_MASK_PARAMETER = "mask_embedding"

_LAYER_PARAMETERS = (
    "self_attn.q_proj.weight",
    "self_attn.k_proj.weight",
    "self_attn.v_proj.weight",
    "self_attn.o_proj.weight",
    "self_attn.q_norm.weight",
    "self_attn.k_norm.weight",
    "mlp.gate_proj.weight",
    "mlp.up_proj.weight",
    "mlp.down_proj.weight",
    "input_layernorm.weight",
    "post_attention_layernorm.weight",
)
_BIAS_PARAMETERS = tuple(f"self_attn.{p}_proj.bias" for p in "qkvo")
_NOT_IN_FORMAT = (
    "_name_or_path",
    "_attn_implementation_autoset",
    "torch_dtype",
    "chunk_size_feed_forward",
    "id2label",
    "label2id",
    "is_encoder_decoder",
    "output_attentions",
    "output_hidden_states",
    "problem_type",
    "return_dict",
)
_FORBIDDEN = re.compile(r"(embed_tokens|lm_head|rotary_emb)")


def expected_weight_names(config: DFlashConfig) -> set[str]:
    """The exact tensor names a checkpoint for `config` holds."""
    names = {"fc.weight", "hidden_norm.weight", "norm.weight"}
    per_layer = _LAYER_PARAMETERS + (_BIAS_PARAMETERS if config.attention_bias else ())
    for i in range(config.num_hidden_layers):
        names.update(f"layers.{i}.{p}" for p in per_layer)
    if config.drafter_kind == "dspark":  # the names qwen3_dspark.py's load_weights maps
        names.update({"markov_head.markov_w1.weight", "markov_head.markov_w2.weight"})
        if getattr(config, "enable_confidence_head", False):
            names.update({"confidence_head.proj.weight", "confidence_head.proj.bias"})
    return names


def drafter_class(config: DFlashConfig) -> type[DFlashDraftModel]:
    """The model class of a drafter config: DFlash, or its DSpark variant."""
    if config.drafter_kind == "dspark":
        from draftsmith.model.dspark import DSparkDraftModel

        return DSparkDraftModel
    return DFlashDraftModel


def drafter_state_dict(model: DFlashDraftModel, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
    """The checkpoint tensors of `model` (unwraps DDP/compile wrappers), contiguous, on CPU."""
    inner = getattr(model, "module", model)
    inner = getattr(inner, "_orig_mod", inner)
    state = {}
    for name, tensor in inner.state_dict().items():
        if _FORBIDDEN.search(name) or name == _MASK_PARAMETER:  # the mask vector ships in its own file
            continue
        tensor = tensor.detach().to("cpu")
        if dtype is not None and tensor.is_floating_point():
            tensor = tensor.to(dtype)
        state[name] = tensor.contiguous()
    expected = expected_weight_names(inner.config)
    if set(state) != expected:
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        raise ValueError(f"drafter state does not match the DFlash format: missing {missing}, unexpected {extra}")
    return state


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def save_drafter(model: DFlashDraftModel, path: str | os.PathLike, dtype: torch.dtype | None = None) -> Path:
    """Write `config.json` and `model.safetensors` into directory `path` (created if needed)."""
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    inner = getattr(getattr(model, "module", model), "_orig_mod", getattr(model, "module", model))
    state = drafter_state_dict(model, dtype=dtype)
    weight_dtype = next(iter(state.values())).dtype

    config_dict = inner.config.to_dict()
    config_dict["architectures"] = [DSPARK_ARCHITECTURE if inner.config.drafter_kind == "dspark" else "DFlashDraftModel"]
    config_dict["model_type"] = "qwen3"
    config_dict["dtype"] = _dtype_name(weight_dtype)
    # Generic PretrainedConfig attributes (classification heads, output flags) and runtime-only
    # ones are not part of the drafter format; published DFlash configs do not carry them.
    for key in _NOT_IN_FORMAT:
        config_dict.pop(key, None)
    # transformers 5 keeps RoPE in `rope_parameters`; engines on transformers 4.x read the legacy
    # `rope_theta` / `rope_scaling` and would silently fall back to theta=10000 without them.
    rope = dict(config_dict.get("rope_parameters") or {})
    if "rope_theta" in rope:
        config_dict["rope_theta"] = rope["rope_theta"]
        scaling = {k: v for k, v in rope.items() if k != "rope_theta"}
        config_dict["rope_scaling"] = scaling if scaling.get("rope_type", "default") != "default" else None

    with atomic_path(out / WEIGHTS_NAME) as weights_tmp:
        save_file(state, str(weights_tmp), metadata={"format": "pt"})
    if inner.mask_embedding is not None:
        embedding = inner.mask_embedding.detach().to("cpu", weight_dtype).contiguous()
        with atomic_path(out / MASK_EMBEDDING_NAME) as mask_tmp:
            torch.save({"mask_token_id": int(inner.config.mask_token_id), "embedding": embedding}, str(mask_tmp))
    write_atomic(out / CONFIG_NAME, json.dumps(config_dict, indent=2, sort_keys=True) + "\n")
    return out


def load_drafter_config(path: str | os.PathLike) -> DFlashConfig:
    config_path = Path(path) / CONFIG_NAME
    if not config_path.is_file():
        raise InputError(f"{config_path}: not found (a drafter directory holds config.json + {WEIGHTS_NAME})")
    raw = read_json(config_path, "drafter config")  # the one JSON reader: a plain file, bounded in size and depth
    if not isinstance(raw, dict):
        raise InputError(f"{config_path}: expected a JSON object, found {type(raw).__name__}")
    architectures = raw.get("architectures") or []
    if "DFlashDraftModel" not in architectures and DSPARK_ARCHITECTURE not in architectures:
        raise InputError(
            f"{config_path}: architectures is {architectures}, expected ['DFlashDraftModel'] or ['{DSPARK_ARCHITECTURE}']"
        )
    if DSPARK_ARCHITECTURE in architectures and not isinstance(raw.get("markov_rank"), int):
        raise InputError(f"{config_path}: a {DSPARK_ARCHITECTURE} config needs an integer markov_rank")
    flash = raw.get("dflash_config") or {}
    for field in ("mask_token_id", "target_layer_ids"):
        if field not in flash:
            raise InputError(f"{config_path}: dflash_config.{field} is missing")
    if "block_size" not in raw and "block_size" not in flash:
        raise InputError(f"{config_path}: block_size is missing")
    return DFlashConfig.from_dict(raw)


def read_mask_embedding_file(path: str | os.PathLike) -> tuple[int | None, torch.Tensor]:
    """(mask_token_id or None, embedding) of a `mask_embedding.pt` as vLLM reads it: a dict
    {"mask_token_id", "embedding"} or a bare tensor; an unreadable file is an `InputError`."""
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as error:  # pickle, zip and shape errors all mean "not a mask embedding"
        raise InputError(f"{path}: not a readable torch file ({type(error).__name__}: {error})") from None
    if isinstance(state, dict):
        if not isinstance(state.get("embedding"), torch.Tensor):
            raise InputError(f"{path}: holds no 'embedding' tensor (keys {sorted(state)})")
        token_id = state.get("mask_token_id")
        if isinstance(token_id, torch.Tensor) and token_id.numel() == 1 and not token_id.is_floating_point():
            token_id = token_id.item()
        if token_id is not None and (not isinstance(token_id, int) or isinstance(token_id, bool) or token_id < 0):
            raise InputError(f"{path}: mask_token_id is {token_id!r:.60}, expected a token id (a whole number >= 0)")
        return token_id, state["embedding"]
    if isinstance(state, torch.Tensor):
        return None, state
    raise InputError(f"{path}: holds a {type(state).__name__}, expected a tensor or a dict with 'embedding'")


def mask_embedding_state(path: str | os.PathLike, config: DFlashConfig) -> dict[str, torch.Tensor]:
    """{"mask_embedding": [hidden]} from the drafter directory `path` when `config` has one, else {}."""
    if not config.has_mask_embedding:
        return {}
    file = Path(path) / MASK_EMBEDDING_NAME
    if not file.is_file():
        raise InputError(f"{file}: not found (dflash_config.mask_token_source is 'drafter_embedding')")
    token_id, embedding = read_mask_embedding_file(file)
    if token_id is not None and token_id != config.mask_token_id:
        raise InputError(f"{file}: mask_token_id {token_id} differs from dflash_config.mask_token_id {config.mask_token_id}")
    if embedding.numel() != config.hidden_size:
        raise InputError(f"{file}: embedding has shape {list(embedding.shape)}, expected [{config.hidden_size}] (hidden size)")
    return {_MASK_PARAMETER: embedding.reshape(-1)}


def nonfinite_description(tensor: torch.Tensor) -> str | None:
    """How many NaN / +-Inf values a float tensor holds ("3 NaN, 1 +Inf of 4096 values"), or None.

    One NaN anywhere poisons every logit it reaches: a drafter with one drafts garbage (or, after an
    argmax over NaN, token 0) while every shape and config check passes."""
    if not tensor.is_floating_point():
        return None
    values = tensor.detach().float() if tensor.dtype not in (torch.float32, torch.float64) else tensor.detach()
    if bool(torch.isfinite(values).all()):
        return None
    counts = [(int(torch.isnan(values).sum()), "NaN"), (int(torch.isposinf(values).sum()), "+Inf"),
              (int(torch.isneginf(values).sum()), "-Inf")]
    return ", ".join(f"{count} {word}" for count, word in counts if count) + f" of {values.numel()} values"


def nonfinite_tensors(state: dict[str, torch.Tensor]) -> list[tuple[str, str]]:
    """(name, description) of every tensor of `state` holding a NaN or an infinity, in name order."""
    found = []
    for name in sorted(state):
        description = nonfinite_description(state[name])
        if description:
            found.append((name, description))
    return found


def read_safetensors(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """All tensors of one safetensors file; a truncated or corrupt file is an `InputError` naming it."""
    read_safetensors_header(path)
    try:
        with safe_open(str(path), framework="pt") as handle:
            return {name: handle.get_tensor(name) for name in handle.keys()}
    except SafetensorError as error:
        raise InputError(f"{path}: not a readable safetensors file, truncated or corrupt ({error})") from None


def _shape_mismatches(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> list[tuple[str, list[int], list[int]]]:
    """(name, shape in the file, shape the config builds) of every tensor whose shapes differ."""
    wanted = model.state_dict()
    return [(name, list(tensor.shape), list(wanted[name].shape)) for name, tensor in sorted(state.items())
            if name in wanted and tuple(tensor.shape) != tuple(wanted[name].shape)]


def load_drafter(
    path: str | os.PathLike,
    dtype: torch.dtype | None = None,
    device: str | torch.device | None = None,
) -> DFlashDraftModel:
    """Load a drafter directory written by `save_drafter` (or any engine-format DFlash checkpoint)."""
    path = Path(path)
    config = load_drafter_config(path)
    weight_files = sorted(path.glob("*.safetensors"))
    if not weight_files:
        raise InputError(f"{path}: no *.safetensors weights next to config.json")
    state: dict[str, torch.Tensor] = {}
    for weight_file in weight_files:
        state.update(read_safetensors(weight_file))

    expected = expected_weight_names(config)
    # Some exporters keep the frozen target tensors or a `model.` prefix; neither is ours to load.
    state = {name.removeprefix("model."): t for name, t in state.items()}
    state = {name: t for name, t in state.items() if not _FORBIDDEN.search(name)}
    missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
    if missing or extra:
        raise InputError(
            f"{path}: weights do not match config.json: missing {missing[:8]}{'...' if len(missing) > 8 else ''}, "
            f"unexpected {extra[:8]}{'...' if len(extra) > 8 else ''}"
        )
    state.update(mask_embedding_state(path, config))
    broken = nonfinite_tensors(state)
    if broken:
        name, description = broken[0]
        more = f" (and {len(broken) - 1} more tensors)" if len(broken) > 1 else ""
        raise InputError(f"{path}: {name} holds non-finite values ({description}){more}; the drafter would draft "
                         "garbage: re-export from a finite checkpoint")

    model = drafter_class(config)(config)
    mismatched = _shape_mismatches(model, state)
    if mismatched:
        name, found, expected = mismatched[0]
        more = f" (and {len(mismatched) - 1} more)" if len(mismatched) > 1 else ""
        raise InputError(f"{path}: {name} has shape {found}, config.json makes it {expected}{more}; the weights "
                         "belong to another config (another rank, width or vocabulary): restore it")
    try:
        model.load_state_dict(state, strict=False)
    except RuntimeError as error:  # anything the shape comparison above did not foresee, on one line
        reason = " ".join(str(error).split())
        raise InputError(f"{path}: weight shapes do not match config.json: {reason[:300]}") from None
    target_dtype = dtype or next(iter(state.values())).dtype
    model = model.to(dtype=target_dtype)
    if device is not None:
        model = model.to(device)
    return model.eval()
