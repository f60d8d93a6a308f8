"""Training DFlash drafters: online and offline training, feature extraction (names import on first use)."""

from draftsmith.core.lazy import lazy_exports

__getattr__, __all__ = lazy_exports(
    "draftsmith.train",
    {
        "TokenizedDataset": "draftsmith.data.tokenized",
        "TokenizedSample": "draftsmith.data.tokenized",
        "load_tokenized": "draftsmith.data.tokenized",
        "write_tokenized": "draftsmith.data.tokenized",
        "ExtractResult": "extract",
        "FeatureStore": "draftsmith.model.feature_store",
        "extract_features": "extract",
        "default_gamma": "loss",
        "dflash_loss": "loss",
        "position_weights": "loss",
        "TrainConfig": "trainer",
        "TrainResult": "trainer",
        "train_drafter": "trainer",
    },
)
