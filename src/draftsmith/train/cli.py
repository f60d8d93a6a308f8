"""`draftsmith train` and `draftsmith extract`."""

from __future__ import annotations

import os
from pathlib import Path

import typer


def _layer_ids(text: str | None) -> list[int] | None:
    if not text:
        return None
    from draftsmith.core.errors import InputError

    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError as error:
        raise InputError(f"--target-layer-ids must be comma-separated integers, got {text!r}") from error


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train_command(
        target: Path = typer.Option(..., help="Target model directory (Hugging Face format)."),
        data: Path = typer.Option(..., help="Tokenized dataset (Parquet shards with input_ids/loss_mask)."),
        out: Path = typer.Option(..., help="Output directory: checkpoints/, drafter/, train_log.jsonl."),
        offline: Path = typer.Option(None, "--offline", help="Features directory from `draftsmith extract` (offline training)."),
        block_size: int = typer.Option(16, min=2),
        draft_layers: int = typer.Option(5, min=1, help="Number of drafter decoder layers."),
        target_layer_ids: str = typer.Option(None, help="Comma-separated target layers to capture (default: spread)."),
        num_features: int = typer.Option(5, min=1, help="Captured target layers when --target-layer-ids is unset."),
        mask_token_id: int = typer.Option(None, help="Mask token id (default: the tokenizer's <|MASK|>)."),
        num_anchors: int = typer.Option(512, min=1, help="Max blocks per sequence."),
        gamma: float = typer.Option(None, help="Loss decay gamma (default 7/5/4 for B=16/10/8)."),
        max_length: int = typer.Option(3072, min=2),
        epochs: int = typer.Option(6, min=1),
        max_steps: int = typer.Option(None, min=1, help="Stop after this many optimizer steps."),
        lr: float = typer.Option(6e-4),
        warmup_ratio: float = typer.Option(0.04),
        weight_decay: float = typer.Option(0.0),
        grad_clip: float = typer.Option(1.0),
        grad_accum: int = typer.Option(1, min=1),
        batch_size: int = typer.Option(1, min=1, help="Sequences per micro-batch per process."),
        dtype: str = typer.Option("auto", help="auto (bf16 on CUDA, fp32 on CPU), fp32 or bf16."),
        gradient_checkpointing: bool = typer.Option(False, help="Recompute drafter layers in backward (less memory)."),
        device: str = typer.Option("auto"),
        threads: int = typer.Option(None, min=1, help="CPU threads per process."),
        seed: int = typer.Option(0),
        save_every: int = typer.Option(0, min=0, help="Checkpoint every N steps (0: each epoch)."),
        resume: bool = typer.Option(False, help="Continue from the latest checkpoint in --out."),
        progress: bool = typer.Option(True, help="Show a progress bar (otherwise log lines)."),
        log_every: int = typer.Option(10, min=1),
        report_to: str = typer.Option(
            "none", "--report-to", help="Also send loss, acc per offset, tau, lr, tokens/s to: none, tensorboard (<out>/runs/) or wandb."
        ),
        benchmark_steps: int = typer.Option(
            None, "--benchmark-steps", min=1, metavar="N",
            help="Time N steps after warm-up, write <out>/train_benchmark.json (for `plan --train --train-bench`) and stop.",
        ),
    ) -> None:
        """Train a DFlash drafter, online (target in the loop) or offline (--offline FEATURES)."""
        from draftsmith.core.errors import InputError
        from draftsmith.train.reporting import check_report_to
        from draftsmith.train.trainer import TrainConfig, train_drafter

        if dtype not in ("auto", "fp32", "bf16"):
            raise InputError(f"--dtype must be auto, fp32 or bf16, got {dtype!r}")
        check_report_to(report_to)
        config = TrainConfig(
            target=target,
            data=data,
            out=out,
            offline_features=offline,
            block_size=block_size,
            num_draft_layers=draft_layers,
            target_layer_ids=_layer_ids(target_layer_ids),
            num_features=num_features,
            mask_token_id=mask_token_id,
            num_anchors=num_anchors,
            gamma=gamma,
            max_length=max_length,
            epochs=epochs,
            max_steps=max_steps,
            lr=lr,
            warmup_ratio=warmup_ratio,
            weight_decay=weight_decay,
            grad_clip=grad_clip,
            grad_accum=grad_accum,
            batch_size=batch_size,
            dtype=dtype,
            device=device,
            gradient_checkpointing=gradient_checkpointing,
            num_threads=threads,
            seed=seed,
            save_every=save_every,
            resume=resume,
            progress=progress,
            log_every=log_every,
            report_to=report_to,
            benchmark_steps=benchmark_steps,
        )
        if benchmark_steps:
            from draftsmith.train.benchmark import BENCHMARK_FILE, benchmark_training

            bench = benchmark_training(config)
            if int(os.environ.get("RANK", "0")) == 0:
                typer.echo(
                    f"{bench['steps']} steps in {bench['seconds']:.2f}s on {bench['device']} x {bench['world_size']}: "
                    f"{bench['steps_per_s']:.3f} steps/s, {bench['tokens_per_s']:,.0f} tok/s, {bench['samples_per_s']:.3f} samples/s, "
                    f"peak memory {bench['peak_memory_bytes'] / 2**30:.2f} GiB; wrote {out / BENCHMARK_FILE}"
                )
            return
        result = train_drafter(config)
        if int(os.environ.get("RANK", "0")) == 0:
            typer.echo(
                f"trained {result.steps} steps in {result.elapsed_s:.1f}s: loss {result.first_loss:.4f} -> "
                f"{result.final_loss:.4f}, train tau ~{result.train_tau:.2f}; drafter in {result.drafter_dir}"
            )

    @app.command("extract")
    def extract_command(
        target: Path = typer.Option(..., help="Target model directory (Hugging Face format)."),
        data: Path = typer.Option(..., help="Tokenized dataset."),
        out: Path = typer.Option(..., help="Features directory to write (resumable)."),
        num_features: int = typer.Option(5, min=1, help="Captured target layers when --target-layer-ids is unset."),
        target_layer_ids: str = typer.Option(None, help="Comma-separated target layers to capture."),
        dtype: str = typer.Option("bfloat16", help="Storage dtype: bfloat16, float16 or float32."),
        max_length: int = typer.Option(3072, min=2, help="Truncate like `train --max-length`."),
        batch_size: int = typer.Option(8, min=1),
        samples_per_shard: int = typer.Option(None, min=1, help="Samples per shard (default: about 1 GiB per shard)."),
        device: str = typer.Option("auto"),
        force: bool = typer.Option(False, help="Extract even if the estimate exceeds free disk."),
        progress: bool = typer.Option(True),
    ) -> None:
        """Dump target hidden-state features to safetensors shards for offline training."""
        from draftsmith.train.extract import extract_features

        extract_features(
            target,
            data,
            out,
            num_features=num_features,
            target_layer_ids=_layer_ids(target_layer_ids),
            dtype=dtype,
            max_length=max_length,
            batch_size=batch_size,
            samples_per_shard=samples_per_shard,
            device=device,
            force=force,
            progress=progress,
            echo=typer.echo,
        )
