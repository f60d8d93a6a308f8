"""Training-side checks over the tokenized dataset (read by `draftsmith.data.tokenized`)."""

from __future__ import annotations

from draftsmith.core.errors import InputError
from draftsmith.data.tokenized import TokenizedDataset


def check_vocabulary(dataset: TokenizedDataset, vocab_size: int) -> None:
    """Refuse data holding a token id outside the target's vocabulary.

    The shards' writer recorded their largest id, so this reads no tokens; only when that is out of
    range is the first offending sample looked for (to name it)."""
    if dataset.max_token_id < vocab_size:
        return
    for index, sample in enumerate(dataset):
        top = int(sample.input_ids.max())
        if top >= vocab_size:
            raise InputError(
                f"{dataset.source}: sample {index} (id {sample.id}) has token id {top}, "
                f"outside the target's vocabulary of {vocab_size}"
            )
