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
- multi-head latent attention (MLA: DeepSeek-V2/V3/R1, Kimi K2; `kv_lora_rank`, `qk_rope_head_dim`):
  the cache holds the compressed latent plus the shared rope key per layer, kv_lora_rank +
  qk_rope_head_dim elements per token, whatever the head count; the MoE part has
  `first_k_dense_replace` dense layers, `n_shared_experts` shared experts of `moe_intermediate_size`
  and `n_routed_experts` routed ones (transformers DeepseekV3Attention/DeepseekV3MoE).
- tied or untied LM head; MTP layers (`mtp_num_hidden_layers`, `num_nextn_predict_layers`).

Every count is bounded by what real models have (`LIMITS`), so a config with 10^9 layers is refused
in a line rather than grown into memory, and inconsistent fields (top-k above the expert count,
heads above the hidden size without `head_dim`, a negative window) are refused naming the file and
the field. A `model_type` outside the families above is planned from its fields with a warning
(`Architecture.warnings`); a recurrent family whose layers are not attention (Mamba, RWKV...) is refused.

The layer shapes follow transformers 5.25's modeling code (Qwen3_5GatedDeltaNet: in_proj_qkv
H->2*Kd+Vd, in_proj_z H->Vd, in_proj_a/b H->Hv, depthwise conv over 2*Kd+Vd channels, out_proj
Vd->H; Qwen3_5Attention/Qwen3NextAttention: q_proj doubled for the output gate; Qwen2 q/k/v biases;
Qwen3/Gemma3 q/k norms; Gemma2/3 four norms per layer). The MTP layer is Qwen3-Next's/DeepSeek-V3's:
fc 2H->H, two input norms, one full-attention decoder layer, a final norm; it shares the
embedding and the LM head. The counts are checked against meta-device transformers models in
tests/plan/test_plan_architecture.py.

A config this cannot read raises `InputError` naming the config file, the field, and for a missing
field the `plan engine` override that replaces what it was needed for (`--params`,
`--kv-bytes-per-token`, `--state-bytes`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

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
_MLA_TYPES = {"deepseek_v2", "deepseek_v3", "kimi_k2"}
MODELED_TYPES = {"llama", "mistral", "mixtral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe", "qwen3_next",
                 *_OUTPUT_GATE_TYPES, *_FOUR_NORM_TYPES, *_MLA_TYPES}
# Families whose layers are recurrent or state-space blocks this file has no shapes for: planning them
# as attention decoders would be wrong by orders of magnitude, so they are refused.
_REFUSED_TYPES = {"mamba", "mamba2", "falcon_mamba", "falcon_h1", "jamba", "bamba", "zamba", "zamba2", "nemotron_h",
                  "granitemoehybrid", "rwkv", "rwkv5", "rwkv6", "rwkv7", "recurrent_gemma", "xlstm", "lfm2", "minimax"}
# Upper bounds no released model comes near (the largest today: ~126 layers, hidden 25,600, 256k-262k
# vocabularies, 128 heads, head_dim 512, 512 experts, intermediate 53,248): a config beyond one is a
# mistake, and planning it would build per-layer tables without bound.
LIMITS = {
    "num_hidden_layers": 4096, "hidden_size": 1 << 18, "vocab_size": 1 << 24, "num_attention_heads": 4096,
    "num_key_value_heads": 4096, "head_dim": 8192, "intermediate_size": 1 << 21, "moe_intermediate_size": 1 << 21,
    "shared_expert_intermediate_size": 1 << 21, "num_experts": 1 << 16, "num_local_experts": 1 << 16,
    "n_routed_experts": 1 << 16, "n_shared_experts": 1 << 10, "num_experts_per_tok": 1 << 16,
    "mtp_num_hidden_layers": 64, "num_nextn_predict_layers": 64, "sliding_window": 1 << 30,
    "sliding_window_pattern": 4096, "full_attention_interval": 4096, "max_window_layers": 4096,
    "decoder_sparse_step": 4096, "first_k_dense_replace": 4096, "moe_layer_freq": 4096,
    "kv_lora_rank": 1 << 16, "q_lora_rank": 1 << 16, "qk_rope_head_dim": 8192, "qk_nope_head_dim": 8192,
    "v_head_dim": 8192, "linear_num_value_heads": 4096, "linear_num_key_heads": 4096, "linear_key_head_dim": 8192,
    "linear_value_head_dim": 8192, "linear_conv_kernel_dim": 1024,
}


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
    kv_lora_rank: int = 0  # MLA: the compressed KV latent per token and layer (0: not MLA)
    qk_rope_head_dim: int = 0  # MLA: the rope key shared by every head, cached beside the latent
    qk_nope_head_dim: int = 0  # MLA: per head, the key part decompressed from the latent
    v_head_dim: int = 0  # MLA: per head, the value decompressed from the latent
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
    warnings: list[str] = []

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    def kv_elements_per_layer(self) -> int:
        """Cached elements per token in one attention layer: K and V of every KV head, or MLA's latent and rope key."""
        if self.mla:
            return self.kv_lora_rank + self.qk_rope_head_dim
        return 2 * self.num_kv_heads * self.head_dim

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
        return self.layers_of(SLIDING if sliding else FULL) * self.kv_elements_per_layer()

    def mtp_kv_elements_per_token(self) -> int:
        return self.mtp_layers * self.kv_elements_per_layer()

    def ssm_state_elements(self) -> int:
        """Gated DeltaNet recurrent state per sequence: value heads x key dim x value dim per layer."""
        return self.layers_of(LINEAR) * self.linear_value_heads * self.linear_key_head_dim * self.linear_value_head_dim

    def conv_state_elements(self) -> int:
        """The short convolution's last (kernel - 1) inputs over q, k and v channels per layer."""
        channels = 2 * self.linear_key_heads * self.linear_key_head_dim + self.linear_value_heads * self.linear_value_head_dim
        return self.layers_of(LINEAR) * channels * max(self.linear_conv_kernel - 1, 0)

    def attention_flops_per_token(self, context: float, prefill: bool = False) -> float:
        """Score and value FLOPs of one new token against `context` cached tokens (2 GEMVs of 2 FLOPs),
        sliding layers up to their window; Gated DeltaNet's state update and read-out (~4 FLOPs per
        state element). MLA decodes in the latent (weights absorbed, as engines decode it): scores over
        latent + rope key, values over the latent, per head; its prefill decompresses K and V and attends
        per head over qk_nope + qk_rope key and v_head_dim value dimensions."""
        width = self.num_heads * self.head_dim
        if self.mla and prefill:
            width = self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim) / 2
        elif self.mla:
            width = self.num_heads * (2 * self.kv_lora_rank + self.qk_rope_head_dim) / 2
        window = min(context, self.sliding_window) if self.sliding_window else context
        return (4 * width * (self.layers_of(FULL) * context + self.layers_of(SLIDING) * window)
                + 4 * self.ssm_state_elements())


class _Reader:
    """Field access on the language section. Errors name the config file and the field (and, for a
    missing field, the override to use instead); every count is held to `LIMITS`."""

    def __init__(self, path: Path, config: dict, section: dict):
        self.path, self.config, self.section = path, config, section

    def get(self, name: str, default: Any = None) -> Any:
        value = self.section.get(name)
        return self.config.get(name, default) if value is None else value

    def fail(self, message: str) -> InputError:
        return InputError(f"{self.path}: {message}")

    def check(self, name: str, value: Any, allow_zero: bool = False) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (value == 0 and not allow_zero):
            kind = "a whole number >= 0" if allow_zero else "a positive integer"
            raise self.fail(f"{name} must be {kind}, got {_shown(value)}")
        limit = LIMITS.get(name)
        if limit is not None and value > limit:
            raise self.fail(f"{name} {value:,} is beyond any real model's (at most {limit:,}); fix the config")
        return value

    def integer(self, names: tuple[str, ...], override: str, default: int | None = None, allow_zero: bool = False) -> int:
        for name in names:
            value = self.get(name)
            if value is None:
                continue
            return self.check(name, value, allow_zero)
        if default is not None:
            return default
        raise self.fail(f"missing {names[0]} (also looked in text_config); pass {override} to plan without it")

    def optional(self, name: str, allow_zero: bool = False) -> int | None:
        value = self.get(name)
        return None if value is None else self.check(name, value, allow_zero)

    def layer_list(self, name: str, layers: int) -> list[int]:
        value = self.get(name)
        if value is None:
            return []
        if not isinstance(value, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in value):
            raise self.fail(f"{name} must be a list of layer indices, got {_shown(value)}")
        outside = [i for i in value if not 0 <= i < layers]
        if outside:
            raise self.fail(f"{name} names layer {outside[0]}, outside the {layers} layers (0..{layers - 1})")
        return value


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _language_section(config: dict) -> dict:
    return next((part for part in language_sections(config) if "hidden_size" in part), config)


def _layer_types(read: _Reader, model_type: str, layers: int) -> list[str]:
    given = read.get("layer_types")
    if given is not None:
        if not isinstance(given, list) or len(given) != layers or any(kind not in (FULL, SLIDING, LINEAR) for kind in given):
            raise read.fail(f"layer_types must list {layers} (num_hidden_layers) of {FULL}, {SLIDING}, {LINEAR}")
        return list(given)
    if model_type in _OUTPUT_GATE_TYPES:  # hybrid Qwen: every `full_attention_interval`-th layer attends
        interval = read.integer(("full_attention_interval",), "--state-bytes", default=4)
        return [FULL if (index + 1) % interval == 0 else LINEAR for index in range(layers)]
    window = read.optional("sliding_window", allow_zero=True)  # 0 or null: no window
    if model_type == "gemma2":  # transformers Gemma2Config: even layers slide
        return [SLIDING if (index + 1) % 2 else FULL for index in range(layers)]
    if model_type in ("gemma3", "gemma3_text"):  # Gemma3TextConfig: 5 sliding, then 1 full
        pattern = read.integer(("sliding_window_pattern",), "--kv-bytes-per-token", default=6)
        return [SLIDING if (index + 1) % pattern else FULL for index in range(layers)]
    if model_type in ("qwen2", "qwen2_moe", "qwen3", "qwen3_moe"):
        if read.get("use_sliding_window") and window:
            first = read.integer(("max_window_layers",), "--kv-bytes-per-token", default=layers, allow_zero=True)
            return [SLIDING if index >= first else FULL for index in range(layers)]
        return [FULL] * layers
    return [SLIDING if window else FULL] * layers  # Mistral/Mixtral: one window on every layer


def _attention(read: _Reader, model_type: str, h: int, heads: int, kv_heads: int, head_dim: int, count: int) -> list[Tensor]:
    if _is_mla(read):
        return _latent_attention(read, h, heads)
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


def _is_mla(read: _Reader) -> bool:
    """Whether the config gives MLA's latent: any `kv_lora_rank` it sets (a 0 is refused by `_mla_shape`,
    not read as "no MLA": a deepseek_v3 planned with a dense cache is 25x too large)."""
    return read.get("kv_lora_rank") is not None


def _mla_shape(read: _Reader) -> dict[str, int]:
    """MLA's dimensions (DeepseekV3Config's defaults where the config leaves one out)."""
    rank = read.get("kv_lora_rank")
    if not isinstance(rank, bool) and isinstance(rank, int) and rank == 0:
        raise read.fail(f"kv_lora_rank {rank}: MLA's compressed KV latent needs a rank of at least 1 (a model "
                        "without MLA has no kv_lora_rank field)")
    return {
        "kv_lora_rank": read.integer(("kv_lora_rank",), "--kv-bytes-per-token"),
        "q_lora_rank": read.optional("q_lora_rank") or 0,  # null: q_proj straight from the hidden state
        "qk_rope_head_dim": read.integer(("qk_rope_head_dim",), "--kv-bytes-per-token", default=64),
        "qk_nope_head_dim": read.integer(("qk_nope_head_dim",), "--params", default=128),
        "v_head_dim": read.integer(("v_head_dim",), "--params", default=128),
    }


def _latent_attention(read: _Reader, h: int, heads: int) -> list[Tensor]:
    """DeepseekV3Attention: q through a low-rank bottleneck (or q_proj), kv_a_proj_with_mqa to the latent and
    the rope key, kv_b_proj from the latent to every head's nope key and value, o_proj."""
    shape = _mla_shape(read)
    latent, rope, q_rank = shape["kv_lora_rank"], shape["qk_rope_head_dim"], shape["q_lora_rank"]
    qk_head = shape["qk_nope_head_dim"] + rope
    tensors = []
    if q_rank:
        tensors += [Tensor(name="q_a_proj", rows=q_rank, cols=h, count=1, role="gemm"),
                    Tensor(name="q_b_proj", rows=heads * qk_head, cols=q_rank, count=1, role="gemm")]
    else:
        tensors.append(Tensor(name="q_proj", rows=heads * qk_head, cols=h, count=1, role="gemm"))
    tensors += [
        Tensor(name="kv_a_proj_with_mqa", rows=latent + rope, cols=h, count=1, role="gemm"),
        Tensor(name="kv_b_proj", rows=heads * (shape["qk_nope_head_dim"] + shape["v_head_dim"]), cols=latent, count=1,
               role="gemm"),
        Tensor(name="o_proj", rows=h, cols=heads * shape["v_head_dim"], count=1, role="gemm"),
        Tensor(name="latent_norms", rows=latent + q_rank, cols=1, count=1, role="vector"),
    ]
    if read.get("attention_bias"):
        tensors.append(Tensor(name="attention_bias", rows=q_rank + latent + rope + h, cols=1, count=1, role="vector"))
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


_EXPERT_FIELDS = ("num_experts", "num_local_experts", "n_routed_experts")


class _MoeLayout:
    """Which layers route to experts, and the widths, read (and checked) once per config."""

    def __init__(self, read: _Reader, layers: int):
        self.experts = read.integer(_EXPERT_FIELDS, "--params", default=0, allow_zero=True)
        self.dense_layers = set(read.layer_list("mlp_only_layers", layers))
        self.step = read.optional("decoder_sparse_step") or 1
        # DeepSeek's rule: layer i routes when i >= first_k_dense_replace and i % moe_layer_freq == 0
        # (transformers DeepseekV2/V3); 0 or a negative frequency is refused by `check`, not read as 1.
        self.frequency = read.optional("moe_layer_freq")
        self.first_dense = read.optional("first_k_dense_replace", allow_zero=True) or 0
        if self.first_dense > layers:
            raise read.fail(f"first_k_dense_replace {self.first_dense} is above num_hidden_layers {layers}")
        self.per_token = 0
        self.routed = self.shared = 0
        self.shared_gate = False
        if not self.experts:
            per_token = read.get("num_experts_per_tok")
            if isinstance(per_token, int) and not isinstance(per_token, bool) and per_token > 0:
                name = next((name for name in _EXPERT_FIELDS if read.get(name) is not None), None)
                if name is not None:  # experts counted as 0, yet each token picks some: no layout plans that
                    raise read.fail(f"{name} 0 with num_experts_per_tok {per_token}: a token cannot pick "
                                    f"{per_token} of no experts; give the expert count the checkpoint holds")
            return
        self.per_token = read.integer(("num_experts_per_tok",), "--params")
        if self.per_token > self.experts:
            name = next(name for name in _EXPERT_FIELDS if read.get(name) is not None)
            raise read.fail(f"num_experts_per_tok {self.per_token} is above {name} {self.experts}: "
                            f"a token cannot pick more experts than there are")
        self.routed = read.optional("moe_intermediate_size") or read.optional("intermediate_size") or 0
        if not self.routed:
            raise read.fail("missing moe_intermediate_size (also looked in text_config); pass --params to plan without it")
        # DeepSeek: n_shared_experts always-on experts of the routed width, no gate; Qwen: one shared expert
        # of its own width behind a sigmoid gate.
        shared_experts = read.optional("n_shared_experts", allow_zero=True)
        if shared_experts is not None:
            self.shared = shared_experts * self.routed
        else:
            self.shared = read.optional("shared_expert_intermediate_size", allow_zero=True) or 0
            self.shared_gate = bool(self.shared)

    def routes(self, index: int) -> bool:
        if self.frequency is not None:
            return bool(self.experts) and index >= self.first_dense and index not in self.dense_layers \
                and index % self.frequency == 0
        return bool(self.experts) and index >= self.first_dense and index not in self.dense_layers \
            and (index + 1) % self.step == 0


def _mlp(read: _Reader, moe: _MoeLayout, h: int, index: int) -> tuple[str, list[Tensor]]:
    """("dense" or "moe", the tensors of ONE layer's MLP at `index`)."""
    if moe.routes(index):
        tensors = [
            Tensor(name="router", rows=moe.experts, cols=h, count=1, role="router"),
            Tensor(name="experts", rows=3 * moe.routed, cols=h, count=moe.experts, role="expert"),
        ]
        if moe.shared:
            tensors.append(Tensor(name="shared_expert", rows=3 * moe.shared, cols=h, count=1, role="gemm"))
        if moe.shared_gate:
            tensors.append(Tensor(name="shared_expert_gate", rows=1, cols=h, count=1, role="router"))
        return "moe", tensors
    inner = read.integer(("intermediate_size",), "--params")
    tensors = [Tensor(name="mlp", rows=3 * inner, cols=h, count=1, role="gemm")]
    if read.get("mlp_bias"):
        tensors.append(Tensor(name="mlp_bias", rows=2 * inner + h, cols=1, count=1, role="vector"))
    return "dense", tensors


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


def _model_type(read: _Reader, section: dict, config: dict) -> tuple[str, list[str]]:
    model_type = str(section.get("model_type") or config.get("model_type") or "")
    if model_type in _REFUSED_TYPES:
        raise read.fail(f"model_type {model_type!r} is a recurrent/state-space family plan engine does not model "
                        f"(it plans {', '.join(sorted(MODELED_TYPES))}); pass --params, --kv-bytes-per-token and "
                        f"--state-bytes instead of --model-config")
    if model_type in MODELED_TYPES or (_is_mla(read) and "deepseek" in model_type):
        return model_type, []
    return model_type, [f"{read.path}: model_type {model_type or '(none)'!r} is not one plan engine models "
                        f"({', '.join(sorted(MODELED_TYPES))}); planned as a decoder of attention and MLP layers from "
                        f"its fields: check the parameter count against the checkpoint"]


def _heads(read: _Reader, h: int) -> tuple[int, int, int]:
    heads = read.integer(("num_attention_heads",), "--params")
    kv_heads = read.integer(("num_key_value_heads",), "--kv-bytes-per-token", default=heads)
    if kv_heads > heads or heads % kv_heads:
        raise read.fail(f"num_key_value_heads {kv_heads} must divide num_attention_heads {heads}")
    head_dim = read.optional("head_dim")
    if head_dim is None and not _is_mla(read):
        if heads > h:
            raise read.fail(f"num_attention_heads {heads} is above hidden_size {h} and no head_dim is given")
        if h % heads:
            raise read.fail(f"hidden_size {h} is not a multiple of num_attention_heads {heads} and no head_dim is given")
    return heads, kv_heads, head_dim or max(h // heads, 1)


def read_architecture(config_json_path: str | Path) -> Architecture:
    """The language model's weights and caches from `config.json` or a model directory."""
    path, config = read_model_config(config_json_path)
    read = _Reader(path, config, _language_section(config))
    try:
        return _read_architecture(read)
    except ValidationError as error:  # a field the reader let through in a shape a Tensor cannot hold
        first = error.errors()[0]
        raise read.fail(f"cannot plan from this config ({first.get('msg', 'invalid')} in its "
                        f"{'.'.join(str(part) for part in first.get('loc', ()))})") from None


def _read_architecture(read: _Reader) -> Architecture:
    path, config, section = read.path, read.config, read.section
    model_type, warnings = _model_type(read, section, config)
    h = read.integer(("hidden_size",), "--params")
    layers = read.integer(("num_hidden_layers",), "--params")
    vocab = read.integer(("vocab_size",), "--params")
    heads, kv_heads, head_dim = _heads(read, h)
    mla = _mla_shape(read) if _is_mla(read) else None
    types = _layer_types(read, model_type, layers)
    if mla and SLIDING in types:
        raise read.fail("kv_lora_rank (MLA) with sliding-window layers: plan engine models MLA on full attention only")
    moe = _MoeLayout(read, layers)
    norms = 4 if model_type in _FOUR_NORM_TYPES else 2
    tensors: list[Tensor] = [Tensor(name="embed_tokens", rows=vocab, cols=h, count=1, role="embedding")]
    linear_shape: dict[str, int] = {}
    moe_layers = 0
    for index, kind in enumerate(types):
        if kind == LINEAR:
            mixer, linear_shape = _gated_deltanet(read, h, 1)
        else:
            mixer = _attention(read, model_type, h, heads, kv_heads, head_dim, 1)
        mlp_kind, mlp = _mlp(read, moe, h, index)
        moe_layers += mlp_kind == "moe"
        tensors = _merge(tensors + mixer + mlp + [Tensor(name="layer_norms", rows=norms * h, cols=1, count=1, role="vector")])
    tensors.append(Tensor(name="final_norm", rows=h, cols=1, count=1, role="vector"))
    tie = bool(section.get("tie_word_embeddings", config.get("tie_word_embeddings", False)))
    if not tie:
        tensors.append(Tensor(name="lm_head", rows=vocab, cols=h, count=1, role="lm_head"))
    mtp = read.integer(("mtp_num_hidden_layers", "num_nextn_predict_layers"), "--params", default=0, allow_zero=True)
    for _ in range(mtp):
        # fc over [embedding; hidden], two input norms, one full-attention decoder layer (its MLP as the
        # last layer's: MoE where that routes), a final norm; the embedding and LM head are shared.
        _, mlp = _mlp(read, moe, h, layers - 1)
        block = [Tensor(name="mtp_fc", rows=h, cols=2 * h, count=1, role="gemm"),
                 *_attention(read, model_type, h, heads, kv_heads, head_dim, 1), *mlp,
                 Tensor(name="mtp_norms", rows=(2 + norms + 1) * h, cols=1, count=1, role="vector")]
        tensors += [tensor.model_copy(update={"mtp": True}) for tensor in block]
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
        sliding_window=read.optional("sliding_window") if SLIDING in types else None,
        kv_lora_rank=mla["kv_lora_rank"] if mla else 0,
        qk_rope_head_dim=mla["qk_rope_head_dim"] if mla else 0,
        qk_nope_head_dim=mla["qk_nope_head_dim"] if mla else 0,
        v_head_dim=mla["v_head_dim"] if mla else 0,
        ssm_state_dtype=str(read.get("mamba_ssm_dtype")) if LINEAR in types and read.get("mamba_ssm_dtype") else None,
        num_experts=moe.experts if moe_layers else 0,
        experts_per_token=moe.per_token if moe_layers else 0,
        moe_layers=moe_layers,
        tie_word_embeddings=tie,
        mtp_layers=mtp,
        tensors=_merge(tensors),
        warnings=warnings,
        **linear_shape,
    )
