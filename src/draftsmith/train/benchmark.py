"""`train --benchmark-steps N`: the measured step rate of a training setup, for `plan --train`.

Runs `warmup` untimed optimizer steps and then N timed ones on the real data and target with the
run's own settings (micro-batch, accumulation, dtype, online/offline, world size), then writes
`<out>/train_benchmark.json` and stops: no checkpoint, no drafter, no train log. The drafter is
updated as in training, so the steps cost what real ones do.
"""

from __future__ import annotations

import resource
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from draftsmith.core.errors import InputError
from draftsmith.core.io import write_json_atomic
from draftsmith.core.limits import choose_threads
from draftsmith.core.lock import lock_directory
from draftsmith.data.tokenized import load_tokenized
from draftsmith.train.config import TrainConfig
from draftsmith.train.distributed import all_reduce_max, all_reduce_sum, barrier, init_distributed, shutdown
from draftsmith.train.loader import StepSampler, make_loader, trainable_indices
from draftsmith.train.trainer import DrafterTrainer

BENCHMARK_FILE = "train_benchmark.json"
KIND = "draftsmith.train_benchmark"  # read by draftsmith.plan.train_bench
DEFAULT_WARMUP_STEPS = 2


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _peak_memory(device: torch.device) -> tuple[int, str]:
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device)), "cuda_max_memory_allocated"
    # Linux reports ru_maxrss in KiB, macOS in bytes.
    scale = 1 if sys.platform == "darwin" else 1024
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * scale), "cpu_max_rss"


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{device} {torch.cuda.get_device_name(device)}"
    return f"cpu ({torch.get_num_threads()} threads)"


def benchmark_training(config: TrainConfig, warmup_steps: int = DEFAULT_WARMUP_STEPS) -> dict[str, Any]:
    """Time `config.benchmark_steps` optimizer steps; returns (and on rank 0 writes) the benchmark dict."""
    if not config.benchmark_steps:
        raise InputError("benchmark_training needs benchmark_steps >= 1")
    context = init_distributed(config.device)
    _, threads_line = choose_threads(config.num_threads, on_cpu=context.device.type == "cpu")
    if threads_line and context.is_main:
        print(f"train: {threads_line}", file=sys.stderr, flush=True)
    try:
        with lock_directory(config.out, "train benchmark") if context.is_main else nullcontext():
            return _benchmark(config, context, warmup_steps)
    finally:
        shutdown(context)


def _benchmark(config: TrainConfig, context, warmup_steps: int) -> dict[str, Any]:
    from draftsmith.train.parallel import parallelize_drafter
    from draftsmith.train.state import MetricsAccumulator
    from draftsmith.train.trainer import _train_step, build_optimizer

    dataset = load_tokenized(config.data, max_length=config.max_length, split=config.split)
    trainable = trainable_indices(dataset)
    if trainable.size == 0:
        raise InputError(f"{config.data}: no sample has two consecutive loss-mask tokens, nothing to benchmark on")
    trainer = DrafterTrainer(config, context, dataset)
    model = parallelize_drafter(trainer.drafter, context, config.sharding)
    total = warmup_steps + config.benchmark_steps
    optimizer, _ = build_optimizer(trainer.drafter, config, total)
    scaler = torch.amp.GradScaler(context.device.type, enabled=trainer.compute_dtype_name == "float16")
    metrics = MetricsAccumulator(config.block_size, context.device)
    # Epochs repeat as needed: a small set still gives `total` steps of the run's shape.
    sampler = StepSampler(trainable, seed=config.seed, rank=context.rank, world_size=context.world_size, batch_size=config.batch_size,
                          grad_accum=config.grad_accum, epochs=total, total_steps=total)  # fmt: skip
    loader = iter(make_loader(trainer.source, sampler, workers=config.data_workers, device=context.device))

    def run_step() -> torch.Tensor:
        """One optimizer step over the next step's micro-batches; [tokens, samples, blocks] of this rank."""
        step_batch = next(loader)
        _train_step(trainer, model, optimizer, scaler, metrics, step_batch, config.grad_clip)
        samples = sum(len(indices) for indices in step_batch.sample_indices)
        blocks = sum(int(batch.anchor_valid.sum()) for batch in step_batch.micro_batches)
        return torch.tensor([step_batch.num_tokens, samples, blocks], dtype=torch.float64)

    for _ in range(warmup_steps):
        run_step()
    _synchronize(context.device)
    barrier(context)
    if context.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(context.device)
    started = time.perf_counter()
    totals = torch.zeros(3, dtype=torch.float64)
    for _ in range(config.benchmark_steps):
        totals += run_step()
    _synchronize(context.device)
    seconds = time.perf_counter() - started
    totals = all_reduce_sum(totals, context)
    # The slowest rank sets the pace of synchronous data-parallel steps.
    seconds = float(all_reduce_max(torch.tensor([seconds], dtype=torch.float64), context)[0])
    peak, peak_kind = _peak_memory(context.device)
    tokens, samples, blocks = (float(value) for value in totals)
    result = {
        "kind": KIND,
        "version": 1,
        "mode": "offline" if config.offline_features else "online",
        "device": _device_name(context.device),
        "world_size": context.world_size,
        "warmup_steps": warmup_steps,
        "steps": config.benchmark_steps,
        "seconds": seconds,
        "steps_per_s": config.benchmark_steps / seconds,
        "tokens_per_s": tokens / seconds,
        "samples_per_s": samples / seconds,
        "mean_tokens_per_sample": tokens / samples,
        "mean_blocks_per_sample": blocks / samples,
        "peak_memory_bytes": peak,
        "peak_memory_kind": peak_kind,
        "shapes": {
            "block_size": config.block_size,
            "num_anchors": config.num_anchors,
            "max_length": config.max_length,
            "batch_size": config.batch_size,
            "grad_accum": config.grad_accum,
            "num_draft_layers": config.num_draft_layers,
            "target_layer_ids": trainer.layer_ids,
            "hidden_size": int(trainer.drafter_config.hidden_size),
            "compute_dtype": trainer.compute_dtype_name,
            "attention": trainer.attention,
            "sharding": config.sharding if context.enabled else "none",
        },
        "seconds_kind": "max over ranks",
        "target": str(config.target),
        "data": str(config.data),
    }
    if context.is_main:
        out_dir = Path(config.out)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out_dir / BENCHMARK_FILE, result, indent=1)
    barrier(context)
    return result
