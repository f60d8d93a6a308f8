"""What the drafter borrows from the target: layer features, the embedding table, the lm_head."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from draftsmith.model.config import DRAFTER_EMBEDDING, FEATURE_DEFINITION, MASK_TOKEN


def _decoder(target_model: nn.Module) -> nn.Module:
    # The bare decoder (e.g. Qwen3Model) avoids computing full-vocab logits we never use.
    base = getattr(target_model, "base_model", None)
    return base if isinstance(base, nn.Module) else target_model


def decoder_layers(target_model: nn.Module) -> nn.ModuleList:
    """The target's decoder layers, in order (`model.layers` for Llama/Qwen-style models)."""
    for owner in (_decoder(target_model), target_model, getattr(target_model, "model", None)):
        for candidate in (owner, getattr(owner, "language_model", None)):
            layers = getattr(candidate, "layers", None)
            if isinstance(layers, nn.ModuleList) and len(layers):
                return layers
    raise ValueError(f"{type(target_model).__name__}: cannot find its decoder layers (no `.layers` list)")


class LayerFeatureTap:
    """Captures "target layer i's feature" during the target's own forward passes.

    The feature of layer i is what decoder layer i returns (hidden + residual), BEFORE the final
    norm: what vLLM and SGLang hand a DFlash drafter. HF's `hidden_states[i + 1]` is the same for
    every layer but the last, where transformers applies the final norm, so forward hooks on the
    layers are the one definition used by training, extraction and evaluation alike.

        with LayerFeatureTap(target, layer_ids) as tap:
            target(input_ids, ...)
            features = tap.take()   # [B, T, k*H]
    """

    def __init__(self, target_model: nn.Module, layer_ids: Sequence[int]) -> None:
        self.layer_ids = [int(i) for i in layer_ids]
        if not self.layer_ids:
            raise ValueError("layer_ids is empty")
        self.layers = decoder_layers(target_model)
        bad = [i for i in self.layer_ids if not 0 <= i < len(self.layers)]
        if bad:
            raise ValueError(f"target layer ids {bad} out of range: the target has {len(self.layers)} layers")
        self._outputs: dict[int, torch.Tensor] = {}
        self._handles: list = []

    def __enter__(self) -> LayerFeatureTap:
        for layer_id in sorted(set(self.layer_ids)):
            self._handles.append(self.layers[layer_id].register_forward_hook(self._hook(layer_id)))
        return self

    def _hook(self, layer_id: int):
        def keep(module, inputs, output):
            self._outputs[layer_id] = output[0] if isinstance(output, (tuple, list)) else output

        return keep

    def __exit__(self, *exc_info) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._outputs.clear()

    def take(self) -> torch.Tensor:
        """The concatenated features of the last forward pass (then forgotten)."""
        missing = [i for i in self.layer_ids if i not in self._outputs]
        if missing:
            raise RuntimeError(f"no output captured for target layers {missing}; run the target inside the tap")
        features = torch.cat([self._outputs[i] for i in self.layer_ids], dim=-1)
        self._outputs.clear()
        return features


@torch.no_grad()
def extract_target_features(
    target_model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    layer_ids: Sequence[int],
    with_final_hidden: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """[B, T, k*H] raw concatenation of the target's layer features for `layer_ids` (no grad);
    `with_final_hidden`: also the decoder's output after its final norm [B, T, H], which the target's
    LM head turns into its next-token logits (soft targets)."""
    with LayerFeatureTap(target_model, layer_ids) as tap:
        output = _decoder(target_model)(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        features = tap.take()
    return (features, output.last_hidden_state) if with_final_hidden else features


def uses_old_last_layer_feature(config) -> bool:
    """True for a drafter config trained before FEATURE_DEFINITION that reads the target's last layer.

    Those drafters learned HF's `hidden_states[L]` (after the final norm) for the last layer, but
    engines give them the pre-norm output, so they are served a feature they never saw.
    """
    flash = getattr(config, "dflash_config", None) or {}
    if flash.get("feature_definition") == FEATURE_DEFINITION:
        return False
    last = int(getattr(config, "num_target_layers", 0) or 0) - 1
    return last >= 0 and last in [int(i) for i in flash.get("target_layer_ids", [])]


def feature_definition_warning(config, where: str = "drafter") -> str | None:
    """A one-paragraph warning for `uses_old_last_layer_feature` configs, else None."""
    if not uses_old_last_layer_feature(config):
        return None
    last = int(config.num_target_layers) - 1
    return (
        f"warning: {where} was trained on the target's last layer ({last}) as transformers' hidden_states "
        f"(after the final norm); vLLM and SGLang feed it that layer's output before the norm, so served "
        f"acceptance will be lower than `draftsmith eval` measured. Retrain with this draftsmith version "
        f"(its config then records dflash_config.feature_definition = {FEATURE_DEFINITION!r})."
    )


def target_embed_tokens(target_model: nn.Module) -> nn.Embedding:
    """The target's input embedding table (the drafter embeds block tokens with it, frozen).

    The table alone, as engines embed the drafter's block: vLLM shares the target's `embed_tokens`
    module, and a target that scales its embeddings (Gemma: x sqrt(hidden_size)) does so outside
    it, while transformers folds the scale into the module (Gemma3TextScaledWordEmbedding). A
    scaled module is therefore replaced by a plain lookup sharing its weight, so train, eval and
    the offline-features path (which reads the bare table) all see what the engine feeds."""
    embedding = target_model.get_input_embeddings()
    if embedding is None:
        raise ValueError(f"{type(target_model).__name__} exposes no input embeddings")
    if type(embedding) is not nn.Embedding and isinstance(embedding, nn.Embedding):
        plain = nn.Embedding(embedding.num_embeddings, embedding.embedding_dim, device="meta")
        plain.weight = embedding.weight
        return plain
    return embedding


def target_lm_head(target_model: nn.Module) -> nn.Module:
    """The target's output projection (the drafter scores its hidden states with it, frozen)."""
    head = getattr(target_model, "lm_head", None)
    if head is None:
        head = target_model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(target_model).__name__} has no lm_head; load it as a *ForCausalLM model")
    return head


def freeze(module: nn.Module) -> nn.Module:
    """Turn off gradients for every parameter (the target, its embeddings, its lm_head)."""
    for parameter in module.parameters():
        parameter.requires_grad_(False)
    return module


def mask_token_id(tokenizer) -> int | None:
    """The id of `<|MASK|>` in `tokenizer`, or None when it has none."""
    token_id = tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    unk = getattr(tokenizer, "unk_token_id", None)
    if token_id is None or (unk is not None and token_id == unk and MASK_TOKEN != tokenizer.unk_token):
        return None
    return int(token_id)


# Added tokens a tokenizer reserves and no text or chat template produces: Llama 3's
# <|reserved_special_token_N|>, Gemma's <unusedN>, Mistral's [control_N], Qwen-style <|reserved...|>.
_RESERVED_TOKEN = re.compile(r"reserved|unused|^\[control_\d+\]$", re.IGNORECASE)


@dataclass(frozen=True)
class MaskChoice:
    """The mask token a drafter's blocks use: its id, its text (None for a row past the tokenizer),
    and why it was chosen. The one rule train, extract, eval, export and check all follow."""

    token_id: int
    token: str | None
    source: str  # "mask_token", "padding_row", "tokenizer_mask", "reserved_token", "pad_token", "drafter_embedding" or "override"

    def describe(self) -> str:
        how = {
            "mask_token": f"the tokenizer's {MASK_TOKEN}",
            "tokenizer_mask": "the tokenizer's own mask token (the chat template never writes it)",
            "padding_row": "the first embedding row past the tokenizer's vocabulary (no text maps to it)",
            "reserved_token": "an unused reserved token of the tokenizer",
            "pad_token": "the tokenizer's pad token (distinct from eos, unused by the chat template)",
            DRAFTER_EMBEDDING: "no spare id: its row is replaced by a trained mask embedding of the drafter "
                               "(shipped as mask_embedding.pt)",
            "override": "--mask-token-id",
        }[self.source]
        shown = f" {self.token!r}" if self.token is not None else ""
        return f"mask token id {self.token_id}{shown}: {how}"

    def record(self) -> dict:
        """What the export's dflash_config records beside mask_token_id (engines ignore it)."""
        return {"mask_token": self.token, "mask_token_source": self.source}


def _template_text(tokenizer) -> str:
    template = getattr(tokenizer, "chat_template", None) or ""
    return "\n".join(template.values()) if isinstance(template, dict) else str(template)


def _role_token_ids(tokenizer) -> set[int]:
    ids = set()
    for name in ("bos_token_id", "eos_token_id", "unk_token_id", "pad_token_id", "sep_token_id", "cls_token_id"):
        value = getattr(tokenizer, name, None)
        ids.update(value if isinstance(value, list) else [] if value is None else [value])
    return {int(i) for i in ids}


_OWN_MASK_TOKENS = ("<mask>", "[MASK]", "<|mask|>")


def _own_mask_token(tokenizer, embedding_rows: int, template: str, roles: set[int]) -> tuple[int, str] | None:
    """The tokenizer's own mask token as (id, text): its `mask_token`, else a special added token
    spelled as one; None when it has none, it lies past the table, a role holds it or the template
    writes it."""
    named = getattr(tokenizer, "mask_token", None)
    candidates = [named] if isinstance(named, str) and named else []
    special = {added.content: int(token_id) for token_id, added in getattr(tokenizer, "added_tokens_decoder", {}).items()
               if getattr(added, "special", False)}
    candidates += [text for text in _OWN_MASK_TOKENS if text in special]
    for text in candidates:
        token_id = special.get(text)
        if token_id is None:
            token_id = tokenizer.convert_tokens_to_ids(text)
        if (isinstance(token_id, int) and 0 <= token_id < embedding_rows and token_id not in roles
                and text not in template):
            return token_id, text
    return None


def choose_mask_token(tokenizer, embedding_rows: int) -> MaskChoice:
    """The mask token of a target whose tokenizer is `tokenizer` and embedding table has
    `embedding_rows` rows.

    In order: the tokenizer's own `<|MASK|>`; the first padding row past the tokenizer (Qwen3:
    151,669 tokens, 151,936 rows -> 151669, the id the published DFlash drafters use); the
    tokenizer's own mask token (Gemma's `<mask>`, a role or special `<mask>`/`[MASK]`) that no role
    holds and the chat template never writes; the highest-numbered unused reserved token (Llama 3's <|reserved_special_token_247|>, Gemma's
    <unused..>, Mistral's [control_N]); a pad token that is neither eos nor in the chat template.
    Never a token that text, a role or the template can produce: the drafter's MASK must not
    look like a token it is asked to predict. With none of these the drafter gets its own
    trainable mask vector ("drafter_embedding") in place of the row of eos (else id 0): a block
    starts with eos only where generation has ended, so no live token loses its embedding.
    """
    existing = mask_token_id(tokenizer)
    if existing is not None and existing < embedding_rows:
        return MaskChoice(existing, MASK_TOKEN, "mask_token")
    vocabulary = len(tokenizer)
    if vocabulary < embedding_rows:
        return MaskChoice(vocabulary, None, "padding_row")
    template, roles = _template_text(tokenizer), _role_token_ids(tokenizer)
    own = _own_mask_token(tokenizer, embedding_rows, template, roles)
    if own is not None:
        return MaskChoice(own[0], own[1], "tokenizer_mask")
    reserved = [
        (int(token_id), added.content)
        for token_id, added in getattr(tokenizer, "added_tokens_decoder", {}).items()
        if _RESERVED_TOKEN.search(added.content) and int(token_id) < embedding_rows
        and int(token_id) not in roles and added.content not in template
    ]
    if reserved:
        token_id, token = max(reserved)
        return MaskChoice(token_id, token, "reserved_token")
    pad = getattr(tokenizer, "pad_token_id", None)
    eos = getattr(tokenizer, "eos_token_id", None)
    if (pad is not None and pad != eos and pad < embedding_rows and tokenizer.pad_token not in template
            and pad not in {getattr(tokenizer, "bos_token_id", None), getattr(tokenizer, "unk_token_id", None)}):
        return MaskChoice(int(pad), tokenizer.pad_token, "pad_token")
    replaced = eos if isinstance(eos, int) and 0 <= eos < embedding_rows else 0
    return MaskChoice(replaced, tokenizer.convert_ids_to_tokens(replaced) if replaced < vocabulary else None, DRAFTER_EMBEDDING)


def override_mask_token(tokenizer, token_id: int) -> MaskChoice:
    """A --mask-token-id given by hand, with its text when the tokenizer has one."""
    token = tokenizer.convert_ids_to_tokens(int(token_id)) if tokenizer is not None and token_id < len(tokenizer) else None
    return MaskChoice(int(token_id), token, "override")


def mask_token_for(target_dir, override: int | None = None) -> MaskChoice:
    """The mask token of a target directory (or `override`), printed to stderr."""
    import sys

    from transformers import AutoTokenizer

    from draftsmith.core.errors import InputError
    from draftsmith.model.target import load_target_config

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    rows = int(load_target_config(target_dir).get_text_config().vocab_size)
    if override is not None:
        if not 0 <= override < rows:
            raise InputError(f"--mask-token-id {override} is outside the target's vocabulary of {rows} (ids 0..{rows - 1})")
        choice = override_mask_token(tokenizer, override)
    else:
        choice = choose_mask_token(tokenizer, rows)
    print(f"draftsmith: {choice.describe()}", file=sys.stderr)
    return choice


def drafter_mask_line(drafter_config, tokenizer, embedding_rows: int) -> str:
    """One line on a trained drafter's mask id against the target's default choice (eval prints it)."""
    flash = getattr(drafter_config, "dflash_config", None) or {}
    mask = int(flash["mask_token_id"])
    choice = choose_mask_token(tokenizer, embedding_rows) if tokenizer is not None else None
    source = flash.get("mask_token_source", "not recorded")
    if choice is not None and choice.token_id == mask and source in (choice.source, "not recorded"):
        return choice.describe()
    return (f"mask token id {mask} ({source}); the target's default would be "
            f"{choice.token_id if choice else 'none'}: the drafter keeps the id it was trained with")


def ensure_mask_token(tokenizer, target_model: nn.Module | None = None) -> int:
    """Return the id of `<|MASK|>`, adding it to `tokenizer` as a special token if absent.

    Resize implications: a new token gets id `len(tokenizer) - 1`. Most released targets pad their
    embedding table beyond the tokenizer (Qwen3: 151,669 tokens, 151,936 rows, so `<|MASK|>` lands
    on row 151669, the id the published DFlash drafters use) and nothing needs resizing. If the id
    does not fit, pass `target_model` and its embeddings (and an untied lm_head) are resized; the
    new row is untrained, which is fine for a drafter input (the drafter learns what MASK means
    from its own side), but then the TARGET checkpoint changed and the resized target plus the
    updated tokenizer must be saved and served together with the drafter. Without `target_model`
    an id that does not fit raises.
    """
    existing = mask_token_id(tokenizer)
    if existing is None:
        tokenizer.add_tokens([MASK_TOKEN], special_tokens=True)
        existing = mask_token_id(tokenizer)
        if existing is None:
            raise ValueError(f"could not add {MASK_TOKEN} to the tokenizer")
    if target_model is not None:
        rows = target_embed_tokens(target_model).num_embeddings
        if existing >= rows:
            target_model.resize_token_embeddings(existing + 1)
    return existing



# Drafter layer parameter -> the same parameter's name in a Llama/Qwen-style target decoder layer.
_LAYER_PARAMETERS = (
    "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
    "self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias", "self_attn.o_proj.bias",
    "self_attn.q_norm.weight", "self_attn.k_norm.weight",
    "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
    "input_layernorm.weight", "post_attention_layernorm.weight",
)  # fmt: skip


def _final_norm(target_model: nn.Module) -> nn.Module | None:
    for owner in (_decoder(target_model), getattr(target_model, "model", None)):
        for candidate in (owner, getattr(owner, "language_model", None)):
            norm = getattr(candidate, "norm", None)
            if isinstance(norm, nn.Module):
                return norm
    return None


@torch.no_grad()
def init_drafter_from_target(drafter: nn.Module, target_model: nn.Module, source_layers: Sequence[int] | None = None) -> list[str]:
    """Copy the target's decoder layers into the drafter's where shapes agree; returns what was copied.

    Draft layer i takes target layer `source_layers[i]` (default: the target's last layers, in
    order: they turn hidden states into next-token predictions, the drafter's job), the drafter's
    final norm takes the target's. Attention, MLP and norms copy; a parameter the target lacks
    (Qwen3's q_norm/k_norm in a Llama target) or whose shape differs keeps its random init, and
    `fc` (k target features -> hidden) has no counterpart. The copy is exact, so the caller can
    check it.
    """
    layers = decoder_layers(target_model)
    count = len(drafter.layers)
    if source_layers is None:
        source_layers = list(range(max(0, len(layers) - count), len(layers)))[-count:]
    source_layers = [int(i) for i in source_layers]
    if len(source_layers) != count or not all(0 <= i < len(layers) for i in source_layers):
        raise ValueError(f"source_layers {source_layers} must name {count} of the target's {len(layers)} layers")
    copied: list[str] = []
    for index, source in enumerate(source_layers):
        theirs = dict(layers[source].named_parameters())
        for name, parameter in drafter.layers[index].named_parameters():
            if name in _LAYER_PARAMETERS and name in theirs and theirs[name].shape == parameter.shape:
                parameter.copy_(theirs[name].to(parameter.dtype))
                copied.append(f"layers.{index}.{name} <- target layer {source}")
    norm = _final_norm(target_model)
    if norm is not None and getattr(norm, "weight", None) is not None and norm.weight.shape == drafter.norm.weight.shape:
        drafter.norm.weight.copy_(norm.weight.to(drafter.norm.weight.dtype))
        copied.append("norm.weight <- target final norm")
    return copied
