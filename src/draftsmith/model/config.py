"""The drafter's configuration: a Qwen3 config plus the DFlash fields serving engines read.

The checkpoint format (see DFLASH.md) is a plain `qwen3` config.json with
`architectures=["DFlashDraftModel"]`, a top-level `block_size` and `num_target_layers`, and
`dflash_config={"mask_token_id", "target_layer_ids"}` (plus draftsmith's own `feature_definition`,
which engines ignore). `DFlashConfig` subclasses
`transformers.Qwen3Config` without adding dataclass fields, so the JSON it writes is exactly what
the reference `dflash` package, SGLang and vLLM load with a stock `Qwen3Config`.
"""

from __future__ import annotations

from typing import Any

from transformers import PretrainedConfig, Qwen3Config

from draftsmith.core.errors import InputError

# Recorded as `dflash_config.feature_definition`: target layer i's feature is decoder layer i's
# output before the final norm (the engines' definition). A config without it predates the rule.
FEATURE_DEFINITION = "decoder_layer_output_pre_norm"

MASK_TOKEN = "<|MASK|>"
# `dflash_config.mask_token_source` of a drafter with its own trainable mask vector: its mask id's
# embedding row is replaced by that vector, shipped as vLLM's optional `mask_embedding.pt`.
DRAFTER_EMBEDDING = "drafter_embedding"
DEFAULT_BLOCK_SIZE = 16
# The architecture a DSpark drafter declares: vLLM routes it to `Qwen3DSparkForCausalLM` (a bare
# "DSparkDraftModel" is its DeepSeek-V4 weights-in-target lane). See model/dspark.py.
DSPARK_ARCHITECTURE = "Qwen3DSparkModel"
DEFAULT_NUM_DRAFT_LAYERS = 5
DEFAULT_NUM_FEATURES = 5

# Size fields copied verbatim from the target: the drafter shares its width, attention geometry and
# RoPE so that the target's embeddings and lm_head plug in and context keys line up with positions.
_COPIED_FROM_TARGET = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "hidden_act",
    "max_position_embeddings",
    "rms_norm_eps",
    "rope_parameters",
    "attention_bias",
    "attention_dropout",
    "initializer_range",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
)


class DFlashConfig(Qwen3Config):
    """`Qwen3Config` with read access to the DFlash fields.

    Stored fields (all plain config attributes, so they round-trip through config.json):
    `block_size`, `num_target_layers`, `dflash_config = {"mask_token_id", "target_layer_ids"}`,
    `num_hidden_layers` (= draft layers), `layer_types` and the Qwen3 size fields.
    """

    model_type = "qwen3"

    @property
    def target_layer_ids(self) -> list[int]:
        return [int(i) for i in _dflash_field(self, "target_layer_ids")]

    @property
    def mask_token_id(self) -> int:
        return int(_dflash_field(self, "mask_token_id"))

    @property
    def has_mask_embedding(self) -> bool:
        """Whether the drafter owns a trainable mask vector (the target has no spare embedding row)."""
        return (getattr(self, "dflash_config", None) or {}).get("mask_token_source") == DRAFTER_EMBEDDING

    @property
    def num_features(self) -> int:
        return len(self.target_layer_ids)

    @property
    def drafter_kind(self) -> str:
        """`dspark` for a DSpark drafter (it has a Markov rank), else `dflash`."""
        return "dspark" if getattr(self, "markov_rank", None) is not None else "dflash"


def _dflash_field(config: PretrainedConfig, name: str) -> Any:
    # The reference looks in `dflash_config` first and falls back to a top-level attribute.
    nested = getattr(config, "dflash_config", None) or {}
    if name in nested:
        return nested[name]
    value = config.__dict__.get(name)
    if value is None:
        raise ValueError(f"drafter config has no dflash_config.{name}")
    return value


SLIDING_ATTENTION = "sliding_attention"


def layer_windows(config: PretrainedConfig) -> list[int | None]:
    """Each draft layer's sliding window (None: full attention), resolved as vLLM's DFlash does:
    `dflash_config.use_swa` makes every layer sliding when `layer_types` names none; otherwise a layer
    slides where `layer_types` says "sliding_attention"; the window is `dflash_config.swa_window_size`,
    else the top-level `sliding_window`. A sliding layer without a window is an error (vLLM refuses it)."""
    flash = getattr(config, "dflash_config", None) or {}
    count = int(config.num_hidden_layers)
    layer_types = getattr(config, "layer_types", None)
    use_swa = bool(flash.get("use_swa", False))
    if layer_types is None or (use_swa and SLIDING_ATTENTION not in layer_types):
        sliding = [use_swa] * count
    else:
        sliding = [kind == SLIDING_ATTENTION for kind in list(layer_types)[:count]]
    window = flash.get("swa_window_size", getattr(config, "sliding_window", None))
    if any(sliding) and not (isinstance(window, int) and not isinstance(window, bool) and window > 0):
        raise ValueError(f"drafter config has sliding layers but no positive window (sliding_window {window!r})")
    return [int(window) if slides else None for slides in sliding]


def default_target_layer_ids(num_target_layers: int, num_features: int = DEFAULT_NUM_FEATURES) -> list[int]:
    """Which target decoder layers (0-based) feed the drafter.

    The paper / reference rule: k=1 -> [L//2]; otherwise round(1 + i*(L-4)/(k-1)) for i in 0..k-1,
    i.e. evenly from layer 1 to layer L-3 (L=36, k=5 -> [1, 9, 17, 25, 33]). The reference's own
    `build_target_layer_ids(L, n)` is the same formula but is called with the number of DRAFT layers
    as k; here k is explicit and the ids are always written into the config, so the two agree
    whenever k equals the draft depth and never depend on it otherwise.

    Shallow targets (L-4 < k-1) make that rule repeat layers (L=4, k=5 -> [1, 1, 1, 1, 1]), which
    wastes fc capacity on identical features. Then k is capped at L-1 and the layers are spread
    evenly over 0..L-2 instead (the tiny 4-layer target gets [0, 1, 2]). The last decoder layer is
    never a default: SGLang crashes on it and the reference `dflash` package reads it after the
    final norm while vLLM reads it before (`draftsmith check` flags it). Every feature is its
    layer's output before the final norm, as engines define it (features.py).
    """
    if num_target_layers < 1:
        raise ValueError(f"num_target_layers must be >= 1, got {num_target_layers}")
    if num_features < 1:
        raise ValueError(f"num_features must be >= 1, got {num_features}")
    if num_features == 1:
        return [num_target_layers // 2 if num_target_layers > 2 else 0]
    span = num_target_layers - 4
    ids = [round(1 + i * span / (num_features - 1)) for i in range(num_features)]
    if span >= num_features - 1 and len(set(ids)) == num_features:
        return ids
    if num_target_layers == 1:
        return [0]
    count = min(num_features, num_target_layers - 1)
    if count == 1:
        return [(num_target_layers - 1) // 2]
    return [round(i * (num_target_layers - 2) / (count - 1)) for i in range(count)]


def resolve_layer_ids(target_config, num_features: int, target_layer_ids: list[int] | None) -> list[int]:
    """The captured target layers of a run (train, extract): explicit ones, else the default rule;
    every id must name one of the target's decoder layers."""
    num_layers = int(target_config.get_text_config().num_hidden_layers)
    layer_ids = list(target_layer_ids) if target_layer_ids else default_target_layer_ids(num_layers, num_features)
    bad = [layer for layer in layer_ids if not 0 <= layer < num_layers]
    if bad:
        raise InputError(f"target layer ids {bad} outside the target's layers 0..{num_layers - 1}")
    return layer_ids


def target_rope_parameters(text_config) -> dict[str, Any]:
    """The RoPE settings a drafter copies from its target: its full-attention layers' when the target
    keeps one set per layer type (Gemma 3: `rope_parameters = {"full_attention": ..., "sliding_attention": ...}`),
    since the drafter's layers are full attention; legacy `rope_theta` when there is no `rope_parameters`."""
    params = getattr(text_config, "rope_parameters", None)
    if isinstance(params, dict) and params and all(isinstance(v, dict) for v in params.values()):
        if "full_attention" not in params:
            raise InputError(f"the target's rope_parameters has no full_attention entry (found {sorted(params)})")
        params = params["full_attention"]
    if not params:
        params = {"rope_type": "default", "rope_theta": float(getattr(text_config, "rope_theta", 10000.0))}
    return dict(params)


def build_drafter_config(
    target_config: PretrainedConfig,
    num_draft_layers: int = DEFAULT_NUM_DRAFT_LAYERS,
    block_size: int = DEFAULT_BLOCK_SIZE,
    target_layer_ids: list[int] | None = None,
    mask_token_id: int | None = None,
    num_features: int = DEFAULT_NUM_FEATURES,
    intermediate_size: int | None = None,
    sliding_window: int | None = None,
) -> DFlashConfig:
    """A drafter config sized like `target_config` (a HF config of the target, e.g. Qwen3/Llama).

    `sliding_window`: every draft layer attends within that many positions (`layer_types` all
    "sliding_attention", `use_sliding_window`, `sliding_window`: the keys vLLM's DFlash and the
    transformers Qwen3 config read), non-causally (`is_causal` false and `dflash_config.causal` false:
    vLLM's DFlash otherwise serves a sliding layer causally). The window trained with is recorded as
    `dflash_config.trained_windows`, so `check` can tell an export that serves another.

    `mask_token_id` is required: use `ensure_mask_token(tokenizer)` (features.py) to get it.
    `target_layer_ids` defaults to `default_target_layer_ids(L, num_features)`.
    """
    text_config = target_config.get_text_config() if hasattr(target_config, "get_text_config") else target_config
    num_target_layers = int(text_config.num_hidden_layers)
    if mask_token_id is None:
        raise ValueError("build_drafter_config needs mask_token_id (see draftsmith.model.ensure_mask_token)")
    if num_draft_layers < 1:
        raise ValueError(f"num_draft_layers must be >= 1, got {num_draft_layers}")
    if block_size < 2:
        raise ValueError(f"block_size must be >= 2 (the anchor plus at least one mask), got {block_size}")
    if sliding_window is not None and not block_size <= int(sliding_window):
        raise ValueError(f"sliding_window {sliding_window} must be at least the block size {block_size}")
    if target_layer_ids is None:
        target_layer_ids = default_target_layer_ids(num_target_layers, num_features)
    target_layer_ids = [int(i) for i in target_layer_ids]
    bad = [i for i in target_layer_ids if not 0 <= i < num_target_layers]
    if bad or not target_layer_ids:
        raise ValueError(
            f"target_layer_ids {target_layer_ids} must be non-empty and within 0..{num_target_layers - 1}"
        )
    vocab_size = int(text_config.vocab_size)
    if not 0 <= int(mask_token_id) < vocab_size:
        raise ValueError(
            f"mask_token_id {mask_token_id} is outside the target's embedding table (vocab_size {vocab_size}); "
            "resize the target's embeddings first (see ensure_mask_token)"
        )

    fields: dict[str, Any] = {}
    for name in _COPIED_FROM_TARGET:
        if hasattr(text_config, name):
            fields[name] = getattr(text_config, name)
    if fields.get("head_dim") is None:
        fields["head_dim"] = text_config.hidden_size // text_config.num_attention_heads
    if fields.get("num_key_value_heads") is None:
        fields["num_key_value_heads"] = text_config.num_attention_heads
    fields["rope_parameters"] = target_rope_parameters(text_config)
    if intermediate_size is not None:
        fields["intermediate_size"] = int(intermediate_size)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        if fields.get(name) is None:
            fields.pop(name, None)

    windowed = sliding_window is not None
    attention: dict[str, Any] = {}
    if windowed:
        attention["is_causal"] = False
    return DFlashConfig(
        architectures=["DFlashDraftModel"],
        num_hidden_layers=int(num_draft_layers),
        layer_types=[SLIDING_ATTENTION if windowed else "full_attention"] * int(num_draft_layers),
        use_sliding_window=windowed,
        sliding_window=int(sliding_window) if windowed else None,
        max_window_layers=0 if windowed else int(num_draft_layers),
        **attention,
        # The drafter ships no head; engines build it from the target's, so this mirrors the target's
        # (a tied target's head IS its embedding table; `check` flags a drafter that says otherwise).
        tie_word_embeddings=bool(getattr(text_config, "tie_word_embeddings", False)),
        block_size=int(block_size),
        num_target_layers=num_target_layers,
        dflash_config={
            "mask_token_id": int(mask_token_id),
            "target_layer_ids": target_layer_ids,
            # Engines read only the two keys above; this records which feature the drafter learned.
            "feature_definition": FEATURE_DEFINITION,
            # The target's own class names: which engines can serve it depends on them (`check`, `export`).
            "target_architectures": [str(name) for name in getattr(target_config, "architectures", None) or []],
            # What each layer was trained with (None: full attention), for `check` to compare with
            # what the config makes engines serve.
            "trained_windows": [int(sliding_window) if windowed else None] * int(num_draft_layers),
            **({"causal": False} if windowed else {}),
        },
        dtype="float32",
        **fields,
    )


def as_dflash_config(config: PretrainedConfig) -> DFlashConfig:
    """Accept a plain Qwen3Config (e.g. loaded by the reference) and view it as a DFlashConfig."""
    if isinstance(config, DFlashConfig):
        return config
    return DFlashConfig.from_dict(config.to_dict())
