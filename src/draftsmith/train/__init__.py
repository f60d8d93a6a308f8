"""Training DFlash drafters: online and offline training, feature extraction.

Names are resolved lazily so that `draftsmith --help` does not pay for importing torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "TokenizedDataset": "draftsmith.data.tokenized",
    "TokenizedSample": "draftsmith.data.tokenized",
    "load_tokenized": "draftsmith.data.tokenized",
    "regenerate_locally": "data",
    "write_tokenized": "draftsmith.data.tokenized",
    "ExtractResult": "extract",
    "FeatureStore": "extract",
    "extract_features": "extract",
    "default_gamma": "loss",
    "dflash_loss": "loss",
    "position_weights": "loss",
    "TrainConfig": "trainer",
    "TrainResult": "trainer",
    "train_drafter": "trainer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        module = _EXPORTS[name]
        return getattr(importlib.import_module(module if "." in module else f"draftsmith.train.{module}"), name)
    raise AttributeError(f"module 'draftsmith.train' has no attribute {name!r}")
