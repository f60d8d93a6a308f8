"""`draftsmith tokenize`: conversations -> masked training rows for the drafter (contract 2)."""

from draftsmith.tokenize.config import TokenizeConfig, TokenizeOptions, TokenizeSummary
from draftsmith.tokenize.masking import ChatMasker, MaskedRow, MaskerConfig, RowDropped, load_tokenizer
from draftsmith.tokenize.pipeline import TokenizeError, tokenize_dataset

__all__ = [
    "ChatMasker",
    "MaskedRow",
    "MaskerConfig",
    "RowDropped",
    "TokenizeConfig",
    "TokenizeError",
    "TokenizeOptions",
    "TokenizeSummary",
    "load_tokenizer",
    "tokenize_dataset",
]
