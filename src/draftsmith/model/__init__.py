"""The DFlash drafter model: config, modules, target features and checkpoint I/O.

Names import on first use, so a command that needs only a light submodule (`model.shape`,
`model.storage`) does not pay for torch and transformers.
"""

from draftsmith.core.lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    "draftsmith.model",
    {
        "DEFAULT_BLOCK_SIZE": "config",
        "MASK_TOKEN": "config",
        "DFlashConfig": "config",
        "as_dflash_config": "config",
        "build_drafter_config": "config",
        "default_target_layer_ids": "config",
        "resolve_layer_ids": "config",
        "FeatureStore": "feature_store",
        "DFlashDraftModel": "drafter",
        "FEATURE_DEFINITION": "features",
        "LayerFeatureTap": "features",
        "decoder_layers": "features",
        "ensure_mask_token": "features",
        "init_drafter_from_target": "features",
        "extract_target_features": "features",
        "feature_definition_warning": "features",
        "freeze": "features",
        "mask_token_id": "features",
        "mask_token_for": "features",
        "MaskChoice": "features",
        "choose_mask_token": "features",
        "uses_old_last_layer_feature": "features",
        "target_embed_tokens": "features",
        "target_lm_head": "features",
        "CONFIG_NAME": "io",
        "WEIGHTS_NAME": "io",
        "MASK_EMBEDDING_NAME": "io",
        "drafter_state_dict": "io",
        "expected_weight_names": "io",
        "load_drafter": "io",
        "load_drafter_config": "io",
        "save_drafter": "io",
        "DecodeResult": "speculative",
        "accept_probability": "speculative",
        "default_stop_token_ids": "speculative",
        "greedy_decode": "speculative",
        "sample_decode": "speculative",
        "speculative_decode": "speculative",
        "prompt_lookup_decode": "speculative",
        "prompt_lookup_drafts": "speculative",
    },
)
