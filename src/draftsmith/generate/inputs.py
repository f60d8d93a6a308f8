"""Which ``--shard i/N`` a prompt belongs to (prompts themselves are read by `draftsmith.data.prompts`)."""

from __future__ import annotations

import hashlib


def shard_of(sample_id: str, shard_count: int) -> int:
    """Which of ``shard_count`` shards a sample belongs to: a stable hash of its id, so shards are
    disjoint and complete whatever the input order or the machine."""
    if shard_count <= 1:
        return 0
    digest = hashlib.blake2b(sample_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shard_count
