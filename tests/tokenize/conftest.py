"""Fixtures for tokenize tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def make_masker(tiny_tokenizer, tiny_target_dir):
    from draftsmith.tokenize.masking import ChatMasker, MaskerConfig

    def make(tokenizer=None, **config):
        return ChatMasker(tokenizer or tiny_tokenizer, MaskerConfig(**config), tiny_target_dir)

    return make
