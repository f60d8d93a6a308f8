"""The tests' small, in-process stand-in for generate + tokenize: greedy answers of a local target."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from draftsmith.core.errors import InputError
from draftsmith.data.tokenized import TokenizedDataset, load_tokenized, write_tokenized


def regenerate_locally(
    target_dir: str | Path,
    prompts: Iterable[dict[str, Any]],
    out_dir: str | Path,
    max_new_tokens: int = 160,
    batch_size: int = 32,
    enable_thinking: bool | None = None,
) -> TokenizedDataset:
    """Regenerate responses with a local HF target (greedy) and write a tokenized dataset.

    Prompt tokens get loss-mask 0 and generated tokens (up to and including the end-of-turn token)
    1: the target's own greedy output is what the drafter must learn to predict. This is the small,
    in-process version of generate + tokenize.
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    model = AutoModelForCausalLM.from_pretrained(target_dir, dtype=torch.float32)
    model.eval()
    eos_ids = model.generation_config.eos_token_id
    eos_ids = set(eos_ids if isinstance(eos_ids, list) else [eos_ids if eos_ids is not None else tokenizer.eos_token_id])
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else next(iter(eos_ids))

    prompt_rows = list(prompts)
    template_kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    encoded: list[tuple[str, list[int]]] = []
    for index, row in enumerate(prompt_rows):
        if "messages" not in row:
            raise InputError(f"prompt {index} (id {row.get('id')}): no 'messages' field")
        ids = tokenizer.apply_chat_template(row["messages"], add_generation_prompt=True, tokenize=True, **template_kwargs)
        if hasattr(ids, "keys"):
            ids = ids["input_ids"]
        encoded.append((str(row.get("id", index)), list(ids)))

    rows: list[dict[str, Any]] = []
    with torch.no_grad():
        for start in range(0, len(encoded), batch_size):
            chunk = encoded[start : start + batch_size]
            width = max(len(ids) for _, ids in chunk)
            batch = torch.full((len(chunk), width), pad_id, dtype=torch.long)
            attention = torch.zeros((len(chunk), width), dtype=torch.long)
            for row_index, (_, ids) in enumerate(chunk):
                batch[row_index, width - len(ids) :] = torch.tensor(ids)
                attention[row_index, width - len(ids) :] = 1
            output = model.generate(
                input_ids=batch,
                attention_mask=attention,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=pad_id,
                eos_token_id=sorted(eos_ids),
            )
            for row_index, (sample_id, ids) in enumerate(chunk):
                generated: list[int] = []
                finish = "length"
                for token in output[row_index, width:].tolist():
                    generated.append(token)
                    if token in eos_ids:
                        finish = "stop"
                        break
                rows.append(
                    {
                        "id": sample_id,
                        "input_ids": ids + generated,
                        "loss_mask": [0] * len(ids) + [1] * len(generated),
                        "finish_reason": finish,
                    }
                )
    write_tokenized(rows, out_dir)
    return load_tokenized(out_dir)
