"""The frozen target, loaded once for every stage that runs it (train, extract, eval, serve).

`load_target_model` puts the weights straight on their device in the run's dtype: transformers builds
the model on the meta device and reads each tensor from the memory-mapped safetensors files (one file
or a sharded set with `model.safetensors.index.json`) into its place on `device`, so a rank holds no
full host copy of the target. `load_embedding_and_head` reads only the two matrices the offline
drafter borrows. A broken target directory (a truncated or corrupt safetensors file, an index naming
a missing shard, a bad `config.json` or `generation_config.json`) is an `InputError`: one line naming
the file, exit 2, no traceback.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from draftsmith.core.errors import InputError
from draftsmith.core.readers import read_json
from draftsmith.core.paths import require_dir

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
WEIGHTS_FILE = "model.safetensors"
WEIGHTS_INDEX_FILE = "model.safetensors.index.json"
EMBED_KEYS = ("model.embed_tokens.weight", "embed_tokens.weight", "model.language_model.embed_tokens.weight")
HEAD_KEYS = ("lm_head.weight",)
# The generation_config.json fields the stages read (stop tokens, sampling defaults).
TOKEN_ID_FIELDS = ("eos_token_id", "pad_token_id", "bos_token_id")
NUMBER_FIELDS = ("temperature", "top_p", "top_k")


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _read_json_object(path: Path) -> dict:
    """A JSON object from `path`, or an `InputError` naming the file (and line) and the problem."""
    payload = read_json(path, "file")  # the one JSON reader: a plain file, bounded in size and depth
    if not isinstance(payload, dict):
        raise InputError(f"{path}: expected a JSON object, found {type(payload).__name__}")
    return payload


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    return text[:300] + ("..." if len(text) > 300 else "") if text else type(error).__name__


def load_target_config(target_dir: str | Path):
    """The target's transformers config, with `config.json` and `generation_config.json` checked."""
    from transformers import AutoConfig

    target_dir = require_dir(target_dir, "--target")
    config_path = target_dir / CONFIG_FILE
    if not config_path.exists():
        raise InputError(f"{target_dir}: no {CONFIG_FILE}; --target must be a Hugging Face model directory")
    _read_json_object(config_path)
    try:
        config = AutoConfig.from_pretrained(target_dir)
    except Exception as error:  # transformers raises ValueError/KeyError/TypeError/OSError for bad fields
        raise InputError(f"{config_path}: not a usable model config ({_one_line(error)})") from None
    text = config.get_text_config()
    for name in ("vocab_size", "hidden_size", "num_hidden_layers"):
        value = getattr(text, name, None)
        if not _is_count(value) or value == 0:
            raise InputError(f"{config_path}: {name} must be a positive integer, found {value!r}")
    _check_generation_config(target_dir)
    return config


def _check_generation_config(target_dir: Path) -> dict | None:
    """The fields of `generation_config.json` (None without one), checked: transformers skips an
    unreadable one with a log line and then decodes with defaults (other stop tokens), so refuse it."""
    path = target_dir / GENERATION_CONFIG_FILE
    if not path.exists():
        return None
    raw = _read_json_object(path)
    for name in TOKEN_ID_FIELDS:
        value = raw.get(name)
        values = value if isinstance(value, list) else [value]
        if value is not None and not all(_is_count(item) for item in values):
            raise InputError(f"{path}: {name} must be a token id or a list of token ids, found {value!r}")
    for name in NUMBER_FIELDS:
        value = raw.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise InputError(f"{path}: {name} must be a number, found {value!r}")
    from transformers import GenerationConfig

    try:
        GenerationConfig.from_pretrained(target_dir)
    except Exception as error:
        raise InputError(f"{path}: not a usable generation config ({_one_line(error)})") from None
    return raw


def generation_stop_ids(model_dir: str | Path) -> list[int]:
    """The `eos_token_id`s of `model_dir/generation_config.json` (none without one), the file checked
    as the target loader checks it: a broken one is an `InputError` naming it, never skipped."""
    raw = _check_generation_config(Path(model_dir))
    value = raw.get("eos_token_id") if raw is not None else None
    if value is None:
        return []
    return [value] if isinstance(value, int) else list(value)


def weight_files(target_dir: str | Path) -> list[Path]:
    """The target's safetensors files (one, or the shards its index names), each checked readable."""
    target_dir = Path(target_dir)
    index_path = target_dir / WEIGHTS_INDEX_FILE
    if index_path.exists():
        weight_map = _read_json_object(index_path).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise InputError(f"{index_path}: no weight_map naming the shard of each tensor")
        files = [target_dir / name for name in dict.fromkeys(str(value) for value in weight_map.values())]
        for file in files:
            if not file.is_file():
                raise InputError(f"{index_path}: names shard {file.name}, which is missing from {target_dir}")
    elif (target_dir / WEIGHTS_FILE).exists():
        files = [target_dir / WEIGHTS_FILE]
    else:
        raise InputError(
            f"{target_dir}: no {WEIGHTS_FILE} or {WEIGHTS_INDEX_FILE}; the target's weights must be safetensors"
        )
    for file in files:
        _tensor_names(file)
    return files


def _tensor_names(file: Path) -> list[str]:
    """The tensor names of one safetensors file; a truncated or corrupt header is an `InputError`.

    safetensors checks that the header parses and that its tensors end exactly at the end of the
    file, so a download cut short is caught here, before any weight is read.
    """
    from safetensors import safe_open

    from draftsmith.model.safetensors_file import read_safetensors_header

    try:
        read_safetensors_header(file)  # offsets and sizes, the same check on every path that reads weights
    except InputError as error:
        raise InputError(f"{error}; re-download the target") from None
    try:
        with safe_open(str(file), framework="pt") as handle:
            return list(handle.keys())
    except Exception as error:
        raise InputError(
            f"{file}: not a readable safetensors file ({_one_line(error)}); it may be truncated, re-download the target"
        ) from None


def load_target_model(target_dir: str | Path, device: torch.device | str, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The frozen target in eval mode, its weights read straight onto `device` in `dtype`."""
    from transformers import AutoModelForCausalLM

    target_dir = Path(target_dir)
    load_target_config(target_dir)
    weight_files(target_dir)
    device = torch.device(device)
    try:
        # A one-device map: transformers materialises each tensor from the memory-mapped file on
        # `device` (no full CPU copy first, unlike `from_pretrained(...).to(device)`).
        model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=dtype, device_map={"": device})
    except (OSError, RuntimeError, ValueError, KeyError) as error:
        raise InputError(f"{target_dir}: the target's weights do not load ({_one_line(error)})") from None
    model.eval()
    model.requires_grad_(False)
    return model


def _tensor_locations(files: list[Path]) -> dict[str, Path]:
    return {name: file for file in files for name in _tensor_names(file)}


def load_embedding_and_head(
    target_dir: str | Path, device: torch.device | str, dtype: torch.dtype = torch.float32
) -> tuple[nn.Embedding, nn.Linear]:
    """Frozen `embed_tokens` and `lm_head`, read alone from the target's safetensors onto `device`."""
    from safetensors import safe_open

    target_dir = Path(target_dir)
    device = torch.device(device)
    config = load_target_config(target_dir)
    locations = _tensor_locations(weight_files(target_dir))

    def read(keys: tuple[str, ...]) -> torch.Tensor | None:
        for key in keys:
            if key in locations:
                with safe_open(str(locations[key]), framework="pt", device=str(device)) as handle:
                    return handle.get_tensor(key).to(dtype)
        return None

    embed_weight = read(EMBED_KEYS)
    head_weight = read(HEAD_KEYS)
    if embed_weight is None or (head_weight is None and not getattr(config, "tie_word_embeddings", False)):
        # Unusual layouts: let transformers resolve the names, then keep only the two modules.
        model = load_target_model(target_dir, device, dtype)
        embed_weight = model.get_input_embeddings().weight.detach()
        head_weight = model.get_output_embeddings().weight.detach()
        del model
    if head_weight is None:
        head_weight = embed_weight
    embedding = nn.Embedding.from_pretrained(embed_weight, freeze=True)
    head = nn.Linear(head_weight.shape[1], head_weight.shape[0], bias=False, device="meta")
    head.weight = nn.Parameter(head_weight, requires_grad=False)
    return embedding, head


def load_final_norm(target_dir: str | Path, device: torch.device | str, dtype: torch.dtype = torch.float32) -> nn.Module:
    """The target's final norm (after its last decoder layer, before the LM head), frozen, its weights
    read alone from the safetensors: with it and the LM head, the last layer's stored feature (its
    pre-norm output) gives the target's next-token logits without the rest of the target."""
    from safetensors import safe_open
    from transformers import AutoModelForCausalLM

    target_dir = Path(target_dir)
    with torch.device("meta"):
        skeleton = AutoModelForCausalLM.from_config(load_target_config(target_dir))
    norm = _final_norm(skeleton)
    prefix = next(name for name, module in skeleton.named_modules() if module is norm)
    locations = _tensor_locations(weight_files(target_dir))
    state = {}
    for name, _ in norm.named_parameters():
        key = f"{prefix}.{name}"
        if key not in locations:
            raise InputError(f"{target_dir}: its weights hold no {key} (the final norm)")
        with safe_open(str(locations[key]), framework="pt", device="cpu") as handle:
            state[name] = handle.get_tensor(key).to(dtype)
    norm = norm.to_empty(device=device)
    norm.load_state_dict(state)
    return norm.requires_grad_(False).eval()


def _final_norm(target_model: nn.Module) -> nn.Module:
    """The decoder's final norm (`model.norm`; a multimodal model's under its language model)."""
    for owner in (getattr(target_model, "base_model", None), target_model, getattr(target_model, "model", None)):
        for candidate in (owner, getattr(owner, "language_model", None)):
            norm = getattr(candidate, "norm", None)
            if isinstance(norm, nn.Module):
                return norm
    raise InputError(f"cannot find the final norm of {type(target_model).__name__} (its decoder's `norm`)")
