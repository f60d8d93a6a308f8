"""What one decode step of a model reads and computes, from its Hugging Face `config.json`.

`read_architecture(path) -> Architecture` lists the language model's weight matrices (the vision
tower of a multimodal config is not counted) by role, and the per-token and per-sequence caches:

- dense decoders: Qwen2/3, Llama, Mistral, Gemma 2/3. Sliding-window layers (Gemma's
  `sliding_window_pattern`/alternation, Mistral's `sliding_window`, Qwen2's `use_sliding_window`,
  or an explicit `layer_types`) keep only their window of KV.
- MoE: Qwen2/3-MoE, Qwen3.5/3.6-A3B (`qwen3_5_moe`), Qwen3-Next, Mixtral: routed experts
  (`num_experts`/`num_local_experts`, `num_experts_per_tok`, `moe_intermediate_size`), shared
  experts (`shared_expert_intermediate_size` with its sigmoid gate), dense layers
  (`mlp_only_layers`, `decoder_sparse_step`).
- hybrid linear attention: Qwen3.5/3.6 (`qwen3_5`, its `text_config`) and Qwen3-Next: `layer_types`
  (or `full_attention_interval`) mark Gated DeltaNet layers, whose state is fixed per sequence.
- tied or untied LM head; MTP layers (`mtp_num_hidden_layers`, `num_nextn_predict_layers`).

The layer shapes follow transformers 5.25's modeling code (Qwen3_5GatedDeltaNet: in_proj_qkv
H->2*Kd+Vd, in_proj_z H->Vd, in_proj_a/b H->Hv, depthwise conv over 2*Kd+Vd channels, out_proj
Vd->H; Qwen3_5Attention/Qwen3NextAttention: q_proj doubled for the output gate; Qwen2 q/k/v biases;
Qwen3/Gemma3 q/k norms; Gemma2/3 four norms per layer). The MTP layer is Qwen3-Next's/DeepSeek-V3's:
fc 2H->H, two input norms, one full-attention decoder layer, a final norm; it shares the
embedding and the LM head. The counts are checked against meta-device transformers models in
tests/plan/test_plan_architecture.py.

A config this cannot read raises `InputError` naming the missing field and the `plan engine`
override that replaces what it was needed for (`--params`, `--kv-bytes-per-token`, `--state-bytes`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from draftsmith.core.errors import InputError
from draftsmith.model.shape import language_sections, read_model_config

Role = Literal["embedding", "lm_head", "gemm", "expert", "router", "vector"]
FULL, SLIDING, LINEAR = "full_attention", "sliding_attention", "linear_attention"
# Qwen's hybrid attention carries an output gate unless the config says otherwise.
_OUTPUT_GATE_TYPES = {"qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text", "qwen3_next"}
_QK_NORM_TYPES = {"qwen3", "qwen3_moe", "qwen3_next", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text",
                  "gemma3", "gemma3_text"}
_QKV_BIAS_TYPES = {"qwen2", "qwen2_moe"}
_FOUR_NORM_TYPES = {"gemma2", "gemma3", "gemma3_text"}


class Tensor(BaseModel):
    """`count` matrices of `rows` x `cols` (a vector has cols 1) with one role."""

    name: str
    rows: int
    cols: int
    count: int
    role: Role
    mtp: bool = False  # part of the MTP module (read only when it drafts)

    @property
    def params(self) -> int:
        return self.rows * self.cols * self.count


class Architecture(BaseModel):
    source: str
    model_type: str
    hidden_size: int
    vocab_size: int
    num_layers: int
    layer_types: list[str]
    num_heads: int
    num_kv_heads: int
    head_dim: int
    sliding_window: int | None = None
    linear_value_heads: int = 0
    linear_key_heads: int = 0
    linear_key_head_dim: int = 0
    linear_value_head_dim: int = 0
    linear_conv_kernel: int = 0
    ssm_state_dtype: str | None = None  # the config's mamba_ssm_dtype, when it gives one
    num_experts: int = 0
    experts_per_token: int = 0
    moe_layers: int = 0
    tie_word_embeddings: bool = False
    mtp_layers: int = 0
    tensors: list[Tensor]

    def layers_of(self, kind: str) -> int:
        return sum(1 for layer in self.layer_types if layer == kind)

    def params(self, mtp: bool = False) -> int:
        """Language-model parameters (embedding, layers, final norm, untied head); with `mtp`, the MTP
        module's instead."""
        return sum(tensor.params for tensor in self.tensors if tensor.mtp == mtp)

    def role_params(self, role: str, mtp: bool = False) -> int:
        return sum(tensor.params for tensor in self.tensors if tensor.role == role and tensor.mtp == mtp)

    def expert_params(self) -> int:
        """Parameters of ONE routed expert in one layer (gate, up and down projections)."""
        if not self.num_experts:
            return 0
        return self.role_params("expert") // (self.num_experts * self.moe_layers)

    def kv_elements_per_token(self, sliding: bool = False) -> int:
        """K and V elements one token keeps in the full-attention (or sliding-window) layers."""
        return self.layers_of(SLIDING if sliding else FULL) * 2 * self.num_kv_heads * self.head_dim

    def mtp_kv_elements_per_token(self) -> int:
        return self.mtp_layers * 2 * self.num_kv_heads * self.head_dim

    def ssm_state_elements(self) -> int:
        """Gated DeltaNet recurrent state per sequence: value heads x key dim x value dim per layer."""
        return self.layers_of(LINEAR) * self.linear_value_heads * self.linear_key_head_dim * self.linear_value_head_dim

    def conv_state_elements(self) -> int:
        """The short convolution's last (kernel - 1) inputs over q, k and v channels per layer."""
        channels = 2 * self.linear_key_heads * self.linear_key_head_dim + self.linear_value_heads * self.linear_value_head_dim
        return self.layers_of(LINEAR) * channels * max(self.linear_conv_kernel - 1, 0)

    def attention_flops_per_token(self, context: float) -> float:
        """Score and value FLOPs of one new token against `context` cached tokens (2 GEMVs of 2 FLOPs),
        sliding layers up to their window; Gated DeltaNet's state update and read-out (~4 FLOPs per
        state element)."""
        width = self.num_heads * self.head_dim
        window = min(context, self.sliding_window) if self.sliding_window else context
        return (4 * width * (self.layers_of(FULL) * context + self.layers_of(SLIDING) * window)
                + 4 * self.ssm_state_elements())


class _Reader:
    """Field access on the language section, with errors naming the override to use instead."""

    def __init__(self, path: Path, config: dict, section: dict):
        self.path, self.config, self.section = path, config, section

    def get(self, name: str, default: Any = None) -> Any:
        value = self.section.get(name)
        return self.config.get(name, default) if value is None else value

    def integer(self, names: tuple[str, ...], override: str, default: int | None = None, allow_zero: bool = False) -> int:
        for name in names:
            value = self.get(name)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (value == 0 and not allow_zero):
                raise InputError(f"{self.path}: {name} must be a positive integer, got {value!r}")
            return value
        if default is not None:
            return default
        raise InputError(f"{self.path}: missing {names[0]} (also looked in text_config); "
                         f"pass {override} to plan without it")


def _language_section(config: dict) -> dict:
    return next((part for part in language_sections(config) if "hidden_size" in part), config)


def _layer_types(read: _Reader, model_type: str, layers: int) -> list[str]:
    given = read.get("layer_types")
    if isinstance(given, list):
        if len(given) != layers or any(kind not in (FULL, SLIDING, LINEAR) for kind in given):
            raise InputError(f"{read.path}: layer_types must list {layers} of {FULL}, {SLIDING}, {LINEAR}")
        return list(given)
    if model_type in _OUTPUT_GATE_TYPES:  # hybrid Qwen: every `full_attention_interval`-th layer attends
        interval = read.integer(("full_attention_interval",), "--state-bytes", default=4)
        return [FULL if (index + 1) % interval == 0 else LINEAR for index in range(layers)]
    window = read.get("sliding_window")
    if model_type == "gemma2":  # transformers Gemma2Config: even layers slide
        return [SLIDING if (index + 1) % 2 else FULL for index in range(layers)]
    if model_type in ("gemma3", "gemma3_text"):  # Gemma3TextConfig: 5 sliding, then 1 full
        pattern = read.integer(("sliding_window_pattern",), "--kv-bytes-per-token", default=6)
        return [SLIDING if (index + 1) % pattern else FULL for index in range(layers)]
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        if read.get("use_sliding_window") and window:
            first = read.integer(("max_window_layers",), "--kv-bytes-per-token", default=layers)
            return [SLIDING if index >= first else FULL for index in range(layers)]
        return [FULL] * layers
    return [SLIDING if window else FULL] * layers  # Mistral/Mixtral: one window on every layer


def _attention(read: _Reader, model_type: str, h: int, heads: int, kv_heads: int, head_dim: int, count: int) -> list[Tensor]:
    gate = read.get("attn_output_gate", model_type in _OUTPUT_GATE_TYPES)
    q, kv = heads * head_dim, kv_heads * head_dim
    tensors = [
        Tensor(name="q_proj", rows=q * (2 if gate else 1), cols=h, count=count, role="gemm"),
        Tensor(name="k_proj", rows=kv, cols=h, count=count, role="gemm"),
        Tensor(name="v_proj", rows=kv, cols=h, count=count, role="gemm"),
        Tensor(name="o_proj", rows=h, cols=q, count=count, role="gemm"),
    ]
    if model_type in _QKV_BIAS_TYPES:
        tensors.append(Tensor(name="qkv_bias", rows=q + 2 * kv, cols=1, count=count, role="vector"))
    elif read.get("attention_bias"):
        tensors.append(Tensor(name="attention_bias", rows=q * (2 if gate else 1) + 2 * kv + h, cols=1, count=count,
                              role="vector"))
    if model_type in _QK_NORM_TYPES:
        tensors.append(Tensor(name="qk_norm", rows=2 * head_dim, cols=1, count=count, role="vector"))
    return tensors


def _gated_deltanet(read: _Reader, h: int, count: int) -> tuple[list[Tensor], dict[str, int]]:
    override = "--state-bytes"
    shape = {
        "linear_value_heads": read.integer(("linear_num_value_heads",), override),
        "linear_key_heads": read.integer(("linear_num_key_heads",), override),
        "linear_key_head_dim": read.integer(("linear_key_head_dim",), override),
        "linear_value_head_dim": read.integer(("linear_value_head_dim",), override),
        "linear_conv_kernel": read.integer(("linear_conv_kernel_dim",), override),
    }
    key = shape["linear_key_heads"] * shape["linear_key_head_dim"]
    value = shape["linear_value_heads"] * shape["linear_value_head_dim"]
    heads = shape["linear_value_heads"]
    tensors = [
        Tensor(name="in_proj_qkv", rows=2 * key + value, cols=h, count=count, role="gemm"),
        Tensor(name="in_proj_z", rows=value, cols=h, count=count, role="gemm"),
        Tensor(name="in_proj_ba", rows=2 * heads, cols=h, count=count, role="gemm"),
        Tensor(name="out_proj", rows=h, cols=value, count=count, role="gemm"),
        Tensor(name="conv1d", rows=2 * key + value, cols=shape["linear_conv_kernel"], count=count, role="vector"),
        Tensor(name="dt_bias_a_log_norm", rows=2 * heads + shape["linear_value_head_dim"], cols=1, count=count,
               role="vector"),
    ]
    return tensors, shape


def _mlp(read: _Reader, model_type: str, h: int, index: int, layers: int) -> tuple[str, list[Tensor]]:
    """("dense" or "moe", the tensors of ONE layer's MLP at `index`)."""
    experts = read.integer(("num_experts", "num_local_experts", "n_routed_experts"), "--params", default=0, allow_zero=True)
    dense_layers = read.get("mlp_only_layers") or []
    step = read.get("decoder_sparse_step") or 1
    if experts and index not in dense_layers and (index + 1) % step == 0:
        routed = read.integer(("moe_intermediate_size",), "--params", default=read.get("intermediate_size") or 0)
        if not routed:
            raise InputError(f"{read.path}: missing moe_intermediate_size (also looked in text_config); "
                             f"pass --params to plan without it")
        tensors = [
            Tensor(name="router", rows=experts, cols=h, count=1, role="router"),
            Tensor(name="experts", rows=3 * routed, cols=h, count=experts, role="expert"),
        ]
        shared = read.get("shared_expert_intermediate_size") or 0
        if shared:
            tensors += [Tensor(name="shared_expert", rows=3 * shared, cols=h, count=1, role="gemm"),
                        Tensor(name="shared_expert_gate", rows=1, cols=h, count=1, role="router")]
        return "moe", tensors
    inner = read.integer(("intermediate_size",), "--params")
    return "dense", [Tensor(name="mlp", rows=3 * inner, cols=h, count=1, role="gemm")]


def _merge(tensors: list[Tensor]) -> list[Tensor]:
    """One entry per (name, shape, role, mtp): the per-layer lists summed over layers."""
    merged: dict[tuple, Tensor] = {}
    for tensor in tensors:
        key = (tensor.name, tensor.rows, tensor.cols, tensor.role, tensor.mtp)
        if key in merged:
            merged[key] = merged[key].model_copy(update={"count": merged[key].count + tensor.count})
        else:
            merged[key] = tensor
    return list(merged.values())


def read_architecture(config_json_path: str | Path) -> Architecture:
    """The language model's weights and caches from `config.json` or a model directory."""
    path, config = read_model_config(config_json_path)
    section = _language_section(config)
    read = _Reader(path, config, section)
    model_type = str(section.get("model_type") or config.get("model_type") or "")
    h = read.integer(("hidden_size",), "--params")
    layers = read.integer(("num_hidden_layers",), "--params")
    vocab = read.integer(("vocab_size",), "--params")
    heads = read.integer(("num_attention_heads",), "--params")
    kv_heads = read.integer(("num_key_value_heads",), "--kv-bytes-per-token", default=heads)
    head_dim = read.integer(("head_dim",), "--kv-bytes-per-token", default=h // heads)
    types = _layer_types(read, model_type, layers)
    norms = 4 if model_type in _FOUR_NORM_TYPES else 2
    tensors: list[Tensor] = [Tensor(name="embed_tokens", rows=vocab, cols=h, count=1, role="embedding")]
    linear_shape: dict[str, int] = {}
    moe_layers = 0
    for index, kind in enumerate(types):
        if kind == LINEAR:
            mixer, linear_shape = _gated_deltanet(read, h, 1)
        else:
            mixer = _attention(read, model_type, h, heads, kv_heads, head_dim, 1)
        mlp_kind, mlp = _mlp(read, model_type, h, index, layers)
        moe_layers += mlp_kind == "moe"
        tensors += mixer + mlp + [Tensor(name="layer_norms", rows=norms * h, cols=1, count=1, role="vector")]
    tensors.append(Tensor(name="final_norm", rows=h, cols=1, count=1, role="vector"))
    tie = bool(section.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    if not tie:
        tensors.append(Tensor(name="lm_head", rows=vocab, cols=h, count=1, role="lm_head"))
    mtp = read.integer(("mtp_num_hidden_layers", "num_nextn_predict_layers"), "--params", default=0, allow_zero=True)
    for _ in range(mtp):
        # fc over [embedding; hidden], two input norms, one full-attention decoder layer, a final norm.
        _, mlp = _mlp(read, model_type, h, layers - 1, layers)
        block = [Tensor(name="mtp_fc", rows=h, cols=2 * h, count=1, role="gemm"),
                 *_attention(read, model_type, h, heads, kv_heads, head_dim, 1), *mlp,
                 Tensor(name="mtp_norms", rows=(2 + norms + 1) * h, cols=1, count=1, role="vector")]
        tensors += [tensor.model_copy(update={"mtp": True}) for tensor in block]
    experts = read.integer(("num_experts", "num_local_experts", "n_routed_experts"), "--params", default=0, allow_zero=True)
    return Architecture(
        source=str(path),
        model_type=model_type,
        hidden_size=h,
        vocab_size=vocab,
        num_layers=layers,
        layer_types=types,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        sliding_window=read.get("sliding_window") if SLIDING in types else None,
        ssm_state_dtype=read.get("mamba_ssm_dtype") if LINEAR in types else None,
        num_experts=experts if moe_layers else 0,
        experts_per_token=read.integer(("num_experts_per_tok",), "--params") if moe_layers else 0,
        moe_layers=moe_layers,
        tie_word_embeddings=tie,
        mtp_layers=mtp,
        tensors=_merge(tensors),
        **linear_shape,
    )
