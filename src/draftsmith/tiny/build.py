"""Build the tiny target model the project uses as its built-in default.

No weights or datasets can be downloaded at run time, so the default target is made here: a
byte-level BPE tokenizer trained on the synthetic corpus, a Qwen3-style chat template with
`<think>` reasoning, and a small `Qwen3ForCausalLM` trained for a few CPU minutes on rendered
conversations so its greedy output has structure. Builds are cached by their settings.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from importlib import resources
from pathlib import Path

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>"]
# Reasoning delimiters are ordinary added tokens, not special ones: engines strip special tokens
# from output text, and `<think>` must survive into the text that reasoning parsers read.
THINK_TOKENS = ["<think>", "</think>"]
BUILD_FORMAT = 1


@dataclass(frozen=True)
class TinyTargetSpec:
    """Settings of a tiny target; the cache key is derived from them."""

    vocab_size: int = 1024
    hidden_size: int = 128
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 256
    max_position_embeddings: int = 2048
    rope_theta: float = 10000.0
    train_conversations: int = 4000
    train_steps: int = 600
    batch_size: int = 32
    learning_rate: float = 3e-3
    seed: int = 0

    def cache_key(self) -> str:
        payload = json.dumps({"format": BUILD_FORMAT, **asdict(self)}, sort_keys=True)
        return hashlib.sha256(payload.encode()).hexdigest()[:16]


def chat_template() -> str:
    return resources.files("draftsmith.tiny").joinpath("chat_template.jinja").read_text()


def default_cache_dir() -> Path:
    root = os.environ.get("DRAFTSMITH_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME", os.path.expanduser("~/.cache")), "draftsmith"
    )
    return Path(root)


def build_tokenizer(
    texts: list[str],
    vocab_size: int,
    *,
    special_tokens: list[str] = SPECIAL_TOKENS,
    roles: dict[str, str | None] | None = None,
    additional_special_tokens: list[str] | None = None,
    added_tokens: list[str] = THINK_TOKENS,
    template: str | None = None,
):
    """Train a byte-level BPE tokenizer and wrap it as a `PreTrainedTokenizerFast`.

    The defaults make the Qwen3-style tiny target's tokenizer; `special_tokens`, `roles` (eos_token,
    pad_token, bos_token, unk_token), `additional_special_tokens`, `added_tokens` and `template`
    make another family's (tiny.families)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts, trainer=trainer)
    if roles is None:
        roles = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "bos_token": None, "unk_token": None}
    if additional_special_tokens is None:
        additional_special_tokens = ["<|im_start|>", "<|MASK|>"]
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, additional_special_tokens=additional_special_tokens, **roles
    )
    if added_tokens:
        wrapped.add_tokens(list(added_tokens), special_tokens=False)
    wrapped.chat_template = chat_template() if template is None else template
    wrapped.model_max_length = 2048
    return wrapped


def _rendered_conversations(tokenizer, count: int, seed: int) -> list[str]:
    from draftsmith.tiny.corpus import synthetic_conversations

    return [
        tokenizer.apply_chat_template(row["messages"], tokenize=False)
        for row in synthetic_conversations(count, seed=seed)
    ]


def _train(model, tokenizer, texts: list[str], spec: TinyTargetSpec, log: Callable[[str], None]):
    import torch

    generator = torch.Generator().manual_seed(spec.seed)
    encoded = [torch.tensor(tokenizer(text)["input_ids"]) for text in texts]
    pad_id = tokenizer.pad_token_id
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate, weight_decay=0.01)
    warmup = max(1, spec.train_steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lambda step: min(1.0, (step + 1) / warmup)
        * max(0.05, 1 - step / max(1, spec.train_steps)),
    )
    model.train()
    started = time.monotonic()
    for step in range(spec.train_steps):
        picks = torch.randint(len(encoded), (spec.batch_size,), generator=generator).tolist()
        batch = torch.nn.utils.rnn.pad_sequence(
            [encoded[i] for i in picks], batch_first=True, padding_value=pad_id
        )
        attention = (
            torch.arange(batch.shape[1])[None, :]
            < torch.tensor([len(encoded[i]) for i in picks])[:, None]
        ).long()
        labels = batch.masked_fill(attention == 0, -100)
        loss = model(input_ids=batch, attention_mask=attention, labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 100 == 0 or step == spec.train_steps - 1:
            elapsed = time.monotonic() - started
            log(f"tiny target: step {step + 1}/{spec.train_steps} loss {loss.item():.3f} ({elapsed:.0f}s)")
    model.eval()
    return loss.item()


def build_tiny_target(
    out_dir: str | Path | None = None,
    spec: TinyTargetSpec | None = None,
    log: Callable[[str], None] = print,
    force: bool = False,
) -> Path:
    """Return a Hugging Face model directory (config, safetensors weights, tokenizer, template).

    With no `out_dir` the build goes to the cache (`$DRAFTSMITH_CACHE` or ~/.cache/draftsmith) keyed
    by the spec, and a finished build there is reused. The directory appears atomically: a
    half-written build is never mistaken for a finished one, and builders started together build once.
    """
    spec = spec or TinyTargetSpec()
    target = Path(out_dir) if out_dir else default_cache_dir() / "tiny-target" / spec.cache_key()
    if (target / "draftsmith_tiny.json").exists() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    from draftsmith.core.lock import waiting_lock

    # Test sessions and the demo started together would each train the same model (minutes of CPU
    # apiece, on a shared machine many times over): the first builds, the rest wait and reuse it.
    with waiting_lock(target.parent / f".{target.name}.build.lock"):
        if (target / "draftsmith_tiny.json").exists() and not force:
            return target
        return _build(target, spec, log)


def _build(target: Path, spec: TinyTargetSpec, log: Callable[[str], None]) -> Path:
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=target.parent))
    try:
        torch.manual_seed(spec.seed)
        from draftsmith.tiny.corpus import synthetic_conversations

        raw_texts = []
        for row in synthetic_conversations(spec.train_conversations, seed=spec.seed):
            for message in row["messages"]:
                raw_texts.append(message["content"])
                raw_texts.append(message.get("reasoning_content") or "")
        tokenizer = build_tokenizer(raw_texts, spec.vocab_size)
        config = Qwen3Config(
            vocab_size=len(tokenizer),
            hidden_size=spec.hidden_size,
            intermediate_size=spec.intermediate_size,
            num_hidden_layers=spec.num_hidden_layers,
            num_attention_heads=spec.num_attention_heads,
            num_key_value_heads=spec.num_key_value_heads,
            head_dim=spec.head_dim,
            max_position_embeddings=spec.max_position_embeddings,
            rope_theta=spec.rope_theta,
            tie_word_embeddings=False,
            bos_token_id=None,
            eos_token_id=tokenizer.convert_tokens_to_ids("<|im_end|>"),
            pad_token_id=tokenizer.pad_token_id,
            torch_dtype="float32",
        )
        model = Qwen3ForCausalLM(config)
        texts = _rendered_conversations(tokenizer, spec.train_conversations, spec.seed)
        final_loss = _train(model, tokenizer, texts, spec, log)
        model.generation_config.eos_token_id = config.eos_token_id
        model.generation_config.pad_token_id = config.pad_token_id
        model.generation_config.do_sample = False
        model.save_pretrained(staging, safe_serialization=True)
        tokenizer.save_pretrained(staging)
        (staging / "chat_template.jinja").write_text(chat_template())
        (staging / "draftsmith_tiny.json").write_text(
            json.dumps({"spec": asdict(spec), "final_loss": final_loss}, indent=2)
        )
        if target.exists():
            shutil.rmtree(target)
        os.replace(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    log(f"tiny target: written to {target}")
    return target
