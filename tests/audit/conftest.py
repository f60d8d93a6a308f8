"""Real files for the audit tests, built with the tiny target's tokenizer and chat template."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from draftsmith.data.tokenized import SCHEMA
from draftsmith.tiny import synthetic_conversations

BOILERPLATE = "Okay."  # with <|im_end|>: exactly 6 trainable tokens under the tiny tokenizer


def encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def tokenize_conversation(tokenizer, messages, *, enable_thinking: bool = True):
    """input_ids and loss_mask the way a tokenize stage does it: train on the final answer only.

    With `enable_thinking=False` the empty think block is part of the generation prompt, so it is
    not trained on (the masking that produced the 6-token incident).
    """
    prompt_kwargs = {} if enable_thinking else {"enable_thinking": False}
    prompt = tokenizer.apply_chat_template(
        messages[:-1], tokenize=False, add_generation_prompt=True, **prompt_kwargs
    )
    full = tokenizer.apply_chat_template(messages, tokenize=False)
    assert full.startswith(prompt), (prompt, full)
    completion = full[len(prompt) :]
    assert completion.endswith("<|im_end|>\n")
    prompt_ids = encode(tokenizer, prompt)
    completion_ids = encode(tokenizer, completion[: -len("\n")])
    newline = encode(tokenizer, "\n")
    input_ids = prompt_ids + completion_ids + newline
    loss_mask = [0] * len(prompt_ids) + [1] * len(completion_ids) + [0] * len(newline)
    return input_ids, loss_mask


def tokenized_rows(tokenizer, count: int, *, boilerplate_share: float = 0.0, seed: int = 3):
    rows = []
    conversations = list(synthetic_conversations(count, seed=seed))
    boilerplate_count = round(count * boilerplate_share)
    for index, conversation in enumerate(conversations):
        messages = conversation["messages"]
        if index < boilerplate_count:
            messages = messages[:-1] + [{"role": "assistant", "content": BOILERPLATE, "reasoning_content": ""}]
            input_ids, loss_mask = tokenize_conversation(tokenizer, messages, enable_thinking=False)
        else:
            input_ids, loss_mask = tokenize_conversation(tokenizer, messages)
        rows.append(
            {
                "id": conversation["id"],
                "input_ids": input_ids,
                "loss_mask": loss_mask,
                "num_tokens": len(input_ids),
                "num_trainable": sum(loss_mask),
                "finish_reason": "stop",
            }
        )
    return rows


TOKENIZED_SCHEMA = SCHEMA  # contract 2, from its one owner


def write_shards(rows, directory: Path, shard_rows: int = 64) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for shard, start in enumerate(range(0, len(rows), shard_rows)):
        table = pa.Table.from_pylist(rows[start : start + shard_rows], schema=TOKENIZED_SCHEMA)
        pq.write_table(table, directory / f"part-{shard:05d}.parquet")
    return directory


def write_jsonl(rows, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        for row in rows:
            handle.write((row if isinstance(row, str) else json.dumps(row)) + "\n")
    return path


@pytest.fixture(scope="session")
def clean_rows(tiny_tokenizer):
    return tokenized_rows(tiny_tokenizer, 300)


@pytest.fixture(scope="session")
def boilerplate_rows(tiny_tokenizer):
    return tokenized_rows(tiny_tokenizer, 300, boilerplate_share=0.87)


@pytest.fixture(scope="session")
def clean_dir(clean_rows, tmp_path_factory):
    return write_shards(clean_rows, tmp_path_factory.mktemp("clean") / "tokenized")


@pytest.fixture(scope="session")
def boilerplate_dir(boilerplate_rows, tmp_path_factory):
    return write_shards(boilerplate_rows, tmp_path_factory.mktemp("boilerplate") / "tokenized")
