"""`draftsmith tokenize`: conversations -> masked training rows for the drafter (contract 2)."""

from draftsmith.tokenize.masking import ChatMasker, MaskedRow, MaskerConfig, RowDropped, load_tokenizer
from draftsmith.tokenize.pipeline import TokenizeError, TokenizeOptions, TokenizeSummary, tokenize_dataset

__all__ = [
    "ChatMasker",
    "MaskedRow",
    "MaskerConfig",
    "RowDropped",
    "TokenizeError",
    "TokenizeOptions",
    "TokenizeSummary",
    "load_tokenizer",
    "tokenize_dataset",
]
