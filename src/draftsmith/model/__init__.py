"""The DFlash drafter model: config, modules, target features and checkpoint I/O."""

from draftsmith.model.config import (
    DEFAULT_BLOCK_SIZE,
    MASK_TOKEN,
    DFlashConfig,
    as_dflash_config,
    build_drafter_config,
    default_target_layer_ids,
)
from draftsmith.model.drafter import DFlashDraftModel
from draftsmith.model.features import (
    ensure_mask_token,
    extract_target_features,
    freeze,
    mask_token_id,
    select_layer_features,
    target_embed_tokens,
    target_lm_head,
)
from draftsmith.model.io import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    drafter_state_dict,
    expected_weight_names,
    load_drafter,
    load_drafter_config,
    save_drafter,
)

__all__ = [
    "CONFIG_NAME",
    "DEFAULT_BLOCK_SIZE",
    "MASK_TOKEN",
    "WEIGHTS_NAME",
    "DFlashConfig",
    "DFlashDraftModel",
    "as_dflash_config",
    "build_drafter_config",
    "default_target_layer_ids",
    "drafter_state_dict",
    "ensure_mask_token",
    "expected_weight_names",
    "extract_target_features",
    "freeze",
    "load_drafter",
    "load_drafter_config",
    "mask_token_id",
    "save_drafter",
    "select_layer_features",
    "target_embed_tokens",
    "target_lm_head",
]
