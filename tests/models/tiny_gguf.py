"""Tiny GGUF files written here with the `gguf` package (a 2-layer, hidden-16 llama with a byte-level
vocabulary): fast real inputs for `models convert`, whole or with a chosen fault."""

from __future__ import annotations

from pathlib import Path

import numpy as np

TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
            "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
HIDDEN, LAYERS, FFN = 16, 2, 32


def _tensor_shapes(vocab: int) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (vocab, HIDDEN), "output_norm.weight": (HIDDEN,)}
    for layer in range(LAYERS):
        block = f"blk.{layer}"
        shapes |= {f"{block}.attn_norm.weight": (HIDDEN,), f"{block}.attn_q.weight": (HIDDEN, HIDDEN),
                   f"{block}.attn_k.weight": (8, HIDDEN), f"{block}.attn_v.weight": (8, HIDDEN),
                   f"{block}.attn_output.weight": (HIDDEN, HIDDEN), f"{block}.ffn_norm.weight": (HIDDEN,),
                   f"{block}.ffn_gate.weight": (FFN, HIDDEN), f"{block}.ffn_up.weight": (FFN, HIDDEN),
                   f"{block}.ffn_down.weight": (HIDDEN, FFN)}
    return shapes


def write_tiny_gguf(path: Path, *, architecture: str = "llama", template: str | None = TEMPLATE,
                    drop: tuple[str, ...] = (), extra: dict[str, tuple[int, ...]] | None = None) -> Path:
    """A complete tiny GGUF at `path`; `drop` leaves tensors out, `extra` adds ones no llama has,
    `architecture` is what its general.architecture says, `template=None` writes no chat template."""
    import gguf
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    tokens = list(bytes_to_unicode().values()) + ["he", "ll", "<|im_start|>", "<|im_end|>"]
    vocab = len(tokens)
    writer = gguf.GGUFWriter(str(path), architecture)
    writer.add_name("tiny")
    writer.add_context_length(64)
    writer.add_embedding_length(HIDDEN)
    writer.add_block_count(LAYERS)
    writer.add_feed_forward_length(FFN)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * (vocab - 2) + [3, 3])
    writer.add_token_merges(["h e", "l l"])
    writer.add_bos_token_id(vocab - 2)
    writer.add_eos_token_id(vocab - 1)
    if template is not None:
        writer.add_chat_template(template)
    rng = np.random.default_rng(0)
    for name, shape in {**_tensor_shapes(vocab), **(extra or {})}.items():
        if name not in drop:
            writer.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
