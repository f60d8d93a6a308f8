"""A model's shapes and parameter count from its Hugging Face `config.json` (Qwen3 layout).

The parameter count is Qwen3's: per layer q/k/v/o projections (GQA, explicit `head_dim`), q/k
RMSNorms over the head dimension, a SwiGLU MLP (gate, up, down) and two RMSNorms; plus the input
embedding, the LM head (unless tied) and the final norm. Biases are counted when `attention_bias`
is set. Llama/Mistral-style configs fit the same formula without the q/k norms being material.
Gemma 2/3 layers carry four norms (pre/post attention and pre/post MLP): the target's count has
them, a drafter layer (Qwen3-shaped) has two.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from draftsmith.core.errors import InputError
from draftsmith.core.io import read_json_file


LANGUAGE_SECTIONS = ("text_config", "llm_config", "language_config")
# transformers Gemma2DecoderLayer/Gemma3DecoderLayer: input, post-attention, pre- and post-feedforward norms.
FOUR_NORM_TYPES = ("gemma2", "gemma3", "gemma3_text")


def read_model_config(config_json_path: str | Path) -> tuple[Path, dict]:
    """The parsed `config.json` of a model directory (or the file itself), and its path."""
    path = Path(config_json_path)
    if path.is_dir():
        path = path / "config.json"
    config = read_json_file(path, "model config")
    if not isinstance(config, dict):
        raise InputError(f"{path}: expected a JSON object")
    return path, config


def language_sections(config: dict):
    """The config itself, then the sections where multimodal configs keep their language model's
    shape: that is the model whose hidden states a drafter consumes."""
    yield config
    for key in LANGUAGE_SECTIONS:
        if isinstance(config.get(key), dict):
            yield config[key]


class TargetShape(BaseModel):
    hidden_size: int
    num_layers: int
    intermediate_size: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    norms_per_layer: int = 2  # RMSNorms of hidden_size in one target layer (Gemma 2/3: 4)
    source: str | None = None

    @property
    def attention_width(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.num_kv_heads * self.head_dim

    def layer_params(self) -> int:
        """Parameters of one decoder layer (also the size of one drafter layer, which copies these shapes)."""
        h, q, kv = self.hidden_size, self.attention_width, self.kv_width
        attention = h * q + 2 * h * kv + q * h + 2 * self.head_dim
        if self.attention_bias:
            attention += q + 2 * kv
        mlp = 3 * h * self.intermediate_size
        return attention + mlp + 2 * h

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def lm_head_params(self) -> int:
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    def target_layer_params(self) -> int:
        """One decoder layer of the target itself: `layer_params` plus the norms a drafter layer has not."""
        return self.layer_params() + (self.norms_per_layer - 2) * self.hidden_size

    def params(self) -> int:
        return (self.num_layers * self.target_layer_params() + self.embedding_params() + self.lm_head_params()
                + self.hidden_size)


def _int_field(section: dict, names: tuple[str, ...], path: Path, required: bool = True) -> int | None:
    for name in names:
        value = section.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise InputError(f"{path}: {name} must be a positive integer, got {value!r}")
        return value
    if required:
        raise InputError(f"{path}: missing {names[0]} (also looked in text_config)")
    return None


def read_target_shape(config_json_path: str | Path) -> TargetShape:
    """Shapes of a target from `config.json` or a model directory (multimodal: its `text_config`)."""
    path, config = read_model_config(config_json_path)
    section = next((part for part in language_sections(config) if "hidden_size" in part), config)
    hidden = _int_field(section, ("hidden_size",), path)
    heads = _int_field(section, ("num_attention_heads",), path)
    kv_heads = _int_field(section, ("num_key_value_heads",), path, required=False) or heads
    head_dim = _int_field(section, ("head_dim",), path, required=False) or hidden // heads
    tie = section.get("tie_word_embeddings", config.get("tie_word_embeddings", False))
    model_type = section.get("model_type") or config.get("model_type")
    return TargetShape(
        hidden_size=hidden,
        num_layers=_int_field(section, ("num_hidden_layers",), path),
        intermediate_size=_int_field(section, ("intermediate_size",), path),
        vocab_size=_int_field(section, ("vocab_size",), path),
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        tie_word_embeddings=bool(tie),
        attention_bias=bool(section.get("attention_bias", False)),
        norms_per_layer=4 if model_type in FOUR_NORM_TYPES else 2,
        source=str(path),
    )
