"""Training DFlash drafters: online and offline training, feature extraction.

Names are resolved lazily so that `draftsmith --help` does not pay for importing torch.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "TokenizedDataset": "data",
    "TokenizedSample": "data",
    "load_tokenized": "data",
    "regenerate_locally": "data",
    "write_tokenized": "data",
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
        return getattr(importlib.import_module(f"draftsmith.train.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module 'draftsmith.train' has no attribute {name!r}")
