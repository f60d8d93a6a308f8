"""The settings of `draftsmith train` and `draftsmith extract`: the CLI options come from these.

Kept free of torch so that building the command line stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from draftsmith.core.config import BlockSize, DType, SequenceTokens, StorageDType, Threads, cli

Beta = Annotated[float, Field(ge=0, lt=1)]


_PANELS = {
    "Data": ("data", "split", "offline_features", "max_length", "num_anchors", "data_workers"),
    "Model": ("target", "drafter", "markov_rank", "confidence_head", "block_size", "num_draft_layers", "target_layer_ids", "num_features", "mask_token_id", "init_from_target", "draft_sliding_window", "dtype",
              "gradient_checkpointing", "attention", "device", "sharding", "num_threads"),
    "Optimization": ("loss_weights", "gamma", "dpace_alpha", "soft_targets", "epochs", "max_steps", "max_minutes", "optimizer", "lr",
                     "min_lr_ratio", "warmup_ratio", "weight_decay", "betas", "muon_lr", "muon_momentum", "muon_weight_decay",
                     "muon_adjust_lr", "muon_ns_steps", "grad_clip", "grad_accum", "batch_size", "seed"),
    "Checkpoints": ("out", "save_every", "keep_checkpoints", "resume", "force_resume"),
    "Logging": ("log_every", "progress", "report_to", "benchmark_steps"),
    "Evaluation": ("eval_prompts", "eval_every", "eval_max_prompts", "eval_max_new_tokens"),
}  # fmt: skip


class TrainConfig(BaseModel):
    """Everything a training run needs; the defaults are the paper's recipe."""

    model_config = ConfigDict(extra="forbid")
    # `train --help` shows the flags in these groups (their names stay flat: --lr, --save-every, ...).
    cli_panels: ClassVar[dict[str, tuple[str, ...]]] = _PANELS

    target: Path = Field(description="target model directory (Hugging Face format)")
    data: Path = Field(description="tokenized dataset: a `draftsmith tokenize` directory (Arrow shards) or one shard file")
    out: Path = Field(description="output directory: checkpoints/, drafter/, train_log.jsonl")
    split: str | None = Field(None, description="DatasetDict split of --data (default: train, else the only one)")
    allow_partial: bool = Field(
        False, description="use an input whose writer (tokenize) is still running or did not finish, as it is; recorded in the manifest"
    )
    offline_features: Annotated[Path | None, cli("--offline")] = Field(
        None, description="features directory from `draftsmith extract` (offline training)"
    )
    drafter: Literal["dflash", "dspark"] = Field(
        "dflash", description="dflash, or dspark (DFlash block + a low-rank Markov head sampled left to right + a confidence head)")
    markov_rank: int | None = Field(None, description="dspark: rank r of the Markov head (V x r, r x V), 1..vocabulary "
                                    "(default: 256, or what a resumed run used)")
    confidence_head: bool = Field(True, description="dspark: train the confidence head (per-position acceptance estimate)")
    block_size: BlockSize = Field(16, description="tokens per draft block (the anchor plus B-1 predictions; dspark: B predictions)")
    num_draft_layers: Annotated[int, cli("--draft-layers")] = Field(5, ge=1, description="drafter decoder layers")
    target_layer_ids: list[int] | None = Field(None, description="target layers to capture (default: spread)")
    num_features: int = Field(5, ge=1, description="captured target layers when target_layer_ids is unset")
    mask_token_id: int | None = Field(None, ge=0, description="default: chosen from the target (its <|MASK|>, a padding row, an unused reserved token; with no spare id, eos's row replaced by a trained mask embedding)")
    init_from_target: bool = Field(
        False, description="start the draft layers (and final norm) as copies of the target's last layers where shapes agree")
    draft_sliding_window: Annotated[SequenceTokens | None, cli(metavar="N")] = Field(
        None, description="sliding-window attention of N positions on every draft layer (layer_types, sliding_window "
        "in the export, as vLLM reads them); at least --block-size; default: full attention")
    num_anchors: int = Field(512, ge=1, description="max blocks per sample (one document), resampled each epoch")
    loss_weights: Literal["decay", "dpace"] = Field(
        "decay", description="per-offset loss weights: decay (the paper's exp(-(k-1)/gamma)) or dpace (D-PACE, arXiv 2605.18810: "
        "adaptive, from the drafter's own confidence, normalised over the step's blocks on every rank)")
    gamma: float | None = Field(None, gt=0, description="loss decay of --loss-weights decay; default 7/5/4 for B=16/10/8")
    dpace_alpha: float = Field(0.5, gt=0, le=1, description="D-PACE confidence smoothing alpha in (0, 1] (--loss-weights dpace)")
    soft_targets: Literal["off", "kl", "tv"] = Field(
        "off", description="score the drafter against the target's full next-token distribution instead of the label: kl "
        "(KL(target || drafter) in place of CE; dspark: + its confidence head) or tv (0.1 KL + 0.9 L1 distance, DSpark's "
        "mix, for either drafter); off: the label's one-hot (CE; dspark 0.1 CE + 0.9 L1)")
    max_length: SequenceTokens = Field(3072, ge=2, description="truncate each sequence to this many tokens")
    epochs: int = Field(6, ge=1, description="passes over the trainable samples")
    max_steps: int | None = Field(None, ge=1, description="stop after this many optimizer steps")
    max_minutes: float | None = Field(
        None, gt=0, description="also stop at the first log step after this many minutes of this run's training (a "
        "wall-clock budget; the learning-rate schedule still spans the planned steps); that step's drafter is published")
    optimizer: Literal["adamw", "muon"] = Field(
        "adamw", description="adamw, or muon (torch.optim.Muon on the draft layers' and fc's weight matrices, AdamW on "
        "norms, biases, the mask embedding and the DSpark heads)")
    lr: float = Field(6e-4, gt=0, description="peak AdamW learning rate (cosine decay after warm-up; --muon-lr follows the same schedule)")
    min_lr_ratio: float = Field(0.0, ge=0, le=1, description="final learning rate as a fraction of --lr")
    warmup_ratio: float = Field(0.04, ge=0, lt=1, description="share of the steps with a linear warm-up")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay (never on norms and vectors)")
    betas: tuple[Beta, Beta] = Field((0.9, 0.95), description="AdamW betas, each in [0, 1)")
    muon_lr: float | None = Field(None, gt=0, description="--optimizer muon: peak Muon learning rate (default: --lr), "
                                  "scaled per matrix by --muon-adjust-lr")
    muon_momentum: float = Field(0.95, ge=0, lt=1, description="--optimizer muon: Muon's (Nesterov) momentum, in [0, 1)")
    muon_weight_decay: float = Field(0.1, ge=0, description="--optimizer muon: decoupled weight decay of the Muon matrices")
    muon_adjust_lr: Literal["match_rms_adamw", "original"] = Field(
        "match_rms_adamw", description="--optimizer muon: per-matrix learning-rate scale: match_rms_adamw (0.2 sqrt(max(A, B)): "
        "AdamW's update size, so AdamW's lr carries over) or original (sqrt(max(1, A/B)), Keller Jordan's)")
    muon_ns_steps: int = Field(5, ge=1, le=99, description="--optimizer muon: Newton-Schulz iterations per update")
    grad_clip: float = Field(1.0, ge=0, description="0 disables clipping")
    grad_accum: int = Field(1, ge=1, description="micro-batches per optimizer step")
    batch_size: int = Field(1, ge=1, description="sequences per micro-batch per process")
    dtype: DType = Field("auto", description="auto (bf16 on CUDA, fp32 on CPU), fp32, bf16 or fp16")
    gradient_checkpointing: bool = Field(False, description="recompute drafter layers in backward to save memory")
    attention: Literal["auto", "dense", "sparse", "flex"] = Field(
        "auto", description="drafter attention: auto (sparse on CPU; flex on CUDA, dense there with attention dropout), dense (reference mask), sparse (tiled), flex (CUDA only)"
    )
    device: str = Field("auto", description="auto (cuda if available, one per torchrun rank), cpu, cuda or cuda:N")
    sharding: Literal["ddp", "fsdp"] = Field(
        "ddp", description="under torchrun: ddp (replicated drafter) or fsdp (FSDP2: drafter, optimizer and target sharded)"
    )
    data_workers: int = Field(2, ge=0, description="DataLoader worker processes building batches ahead (0: in the loop)")
    num_threads: Annotated[Threads | None, cli("--threads")] = Field(None, description="torch CPU threads per process (default: one per CPU the machine's 1-minute load leaves idle, printed; at most 4 per CPU)")
    seed: int = Field(0, description="seeds the drafter's initial weights, the epoch order and the anchors")
    save_every: int = Field(0, ge=0, description="checkpoint every N steps (0: at each epoch end)")
    keep_checkpoints: int = Field(2, ge=1, description="newest checkpoints kept under <out>/checkpoints")
    resume: bool = Field(False, description="continue from the latest checkpoint in --out")
    force_resume: bool = Field(False, description="resume although --target or --data differ from the run's manifest")
    log_every: int = Field(10, ge=1, description="write train_log.jsonl (and sync the host) every N steps")
    progress: bool = Field(True, description="show a progress bar (otherwise log lines)")
    report_to: Literal["none", "tensorboard", "wandb"] = Field(
        "none", description="also send loss, acc per block offset, tau, lr and tokens/s to tensorboard (<out>/runs/) or wandb"
    )
    eval_prompts: Annotated[Path | None, cli(metavar="FILE")] = Field(
        None, description="prompt rows (as `eval` reads): real speculative decoding tau at eval points, logged; best kept in <out>/drafter-best",
    )
    eval_every: int = Field(0, ge=0, description="eval every N steps (0: at each checkpoint) and at the end")
    eval_max_prompts: int = Field(8, ge=1, description="prompts of --eval-prompts decoded at each eval point")
    eval_max_new_tokens: SequenceTokens = Field(128, description="tokens generated per eval prompt")
    benchmark_steps: Annotated[int | None, cli(metavar="N")] = Field(
        None, ge=1,
        description="time N steps after warm-up, write <out>/train_benchmark.json (for `plan --train --train-bench`) and stop",
    )

    @model_validator(mode="after")
    def _no_flag_of_another_variant_or_loss(self) -> TrainConfig:
        """A setting given (flag or config-file key) that this run's drafter or loss never reads is refused,
        not ignored: `--markov-rank` on DFlash or `--gamma` with D-PACE trains something other than asked."""
        given = self.model_fields_set
        foreign = []
        if self.drafter != "dspark":
            foreign += [(name, "--drafter dspark") for name in ("markov_rank", "confidence_head")
                        if name in given and (name != "markov_rank" or self.markov_rank is not None)]
        if self.loss_weights != "dpace" and "dpace_alpha" in given:
            foreign.append(("dpace_alpha", "--loss-weights dpace"))
        if self.loss_weights != "decay" and "gamma" in given and self.gamma is not None:
            foreign.append(("gamma", "--loss-weights decay"))
        if foreign:
            name, owner = foreign[0]
            flag = "--" + name.replace("_", "-")
            this = f"--drafter {self.drafter}" if owner.startswith("--drafter") else f"--loss-weights {self.loss_weights}"
            raise ValueError(f"{flag} is a setting of {owner}, and this run trains with {this}, which never reads it: "
                             f"leave {flag} out or pass {owner}")
        return self


class ExtractConfig(BaseModel):
    """What `draftsmith extract` dumps: the target's captured-layer features of a tokenized set."""

    model_config = ConfigDict(extra="forbid")

    target: Path = Field(description="target model directory (Hugging Face format)")
    data: Path = Field(description="tokenized dataset")
    out: Path = Field(description="features directory to write (resumable)")
    num_features: int = Field(5, ge=1, description="captured target layers when --target-layer-ids is unset")
    target_layer_ids: list[int] | None = Field(None, description="target layers to capture")
    dtype: StorageDType = Field("bfloat16", description="storage dtype: bf16, fp16 or fp32")
    max_length: SequenceTokens = Field(3072, ge=2, description="truncate like `train --max-length`")
    batch_size: int = Field(8, ge=1)
    samples_per_shard: int | None = Field(None, ge=1, description="samples per shard (default: about 1 GiB per shard)")
    device: str = "auto"
    threads: Threads | None = Field(None, description="torch CPU threads (default: one per CPU the machine's 1-minute "
                                    "load leaves idle, printed; at most 4 per CPU)")
    force: bool = Field(False, description="extract even if the estimate exceeds free disk")
    allow_partial: bool = Field(
        False, description="use a tokenized set whose tokenize run is still running or did not finish, as it is; recorded in the manifest"
    )
    progress: bool = True
