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
    FEATURE_DEFINITION,
    LayerFeatureTap,
    decoder_layers,
    ensure_mask_token,
    extract_target_features,
    feature_definition_warning,
    freeze,
    mask_token_id,
    uses_old_last_layer_feature,
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
    "FEATURE_DEFINITION",
    "MASK_TOKEN",
    "WEIGHTS_NAME",
    "DFlashConfig",
    "DFlashDraftModel",
    "LayerFeatureTap",
    "as_dflash_config",
    "build_drafter_config",
    "decoder_layers",
    "default_target_layer_ids",
    "drafter_state_dict",
    "ensure_mask_token",
    "expected_weight_names",
    "extract_target_features",
    "feature_definition_warning",
    "freeze",
    "load_drafter",
    "load_drafter_config",
    "mask_token_id",
    "save_drafter",
    "target_embed_tokens",
    "target_lm_head",
    "uses_old_last_layer_feature",
]
