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
from draftsmith.core.lock import lock_directory
from draftsmith.data.tokenized import load_tokenized
from draftsmith.train.anchors import valid_anchor_positions
from draftsmith.train.config import TrainConfig
from draftsmith.train.distributed import all_reduce_sum, barrier, init_distributed, shutdown
from draftsmith.train.trainer import DrafterTrainer, epoch_order, micro_batches

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
    if config.num_threads is not None:
        torch.set_num_threads(config.num_threads)
    context = init_distributed(config.device)
    try:
        with lock_directory(config.out, "train benchmark") if context.is_main else nullcontext():
            return _benchmark(config, context, warmup_steps)
    finally:
        shutdown(context)


def _benchmark(config: TrainConfig, context, warmup_steps: int) -> dict[str, Any]:
    dataset = load_tokenized(config.data, max_length=config.max_length, split=config.split)
    trainable = [i for i, s in enumerate(dataset.samples) if valid_anchor_positions(torch.from_numpy(s.loss_mask)).numel() > 0]
    if not trainable:
        raise InputError(f"{config.data}: no sample has two consecutive loss-mask tokens, nothing to benchmark on")
    trainer = DrafterTrainer(config, context, dataset)
    drafter = trainer.drafter
    if context.enabled:
        from torch.nn.parallel import DistributedDataParallel

        drafter = DistributedDataParallel(drafter, device_ids=[context.device.index] if context.device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(trainer.drafter.parameters(), lr=config.lr, betas=config.betas, weight_decay=config.weight_decay)
    batches = micro_batches([trainable[i] for i in epoch_order(len(trainable), config.seed, 0, context)], config.batch_size)

    def run_step(index: int) -> torch.Tensor:
        """One optimizer step over `grad_accum` micro-batches (cycling the epoch); [tokens, samples, blocks]."""
        optimizer.zero_grad(set_to_none=True)
        counts = torch.zeros(3, dtype=torch.float64)
        for micro in range(config.grad_accum):
            sample_indices = batches[(index * config.grad_accum + micro) % len(batches)]
            sync = micro == config.grad_accum - 1
            with drafter.no_sync() if (context.enabled and not sync) else nullcontext():
                output, batch = trainer.forward_loss(drafter, sample_indices, 0)
                (output.loss / config.grad_accum).backward()
            counts += torch.tensor([batch.num_tokens, len(sample_indices), float(output.blocks)], dtype=torch.float64)
        if config.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(trainer.drafter.parameters(), config.grad_clip)
        optimizer.step()
        return counts

    for index in range(warmup_steps):
        run_step(index)
    _synchronize(context.device)
    barrier(context)
    if context.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(context.device)
    started = time.perf_counter()
    totals = torch.zeros(3, dtype=torch.float64)
    for index in range(warmup_steps, warmup_steps + config.benchmark_steps):
        totals += run_step(index)
    _synchronize(context.device)
    seconds = time.perf_counter() - started
    totals = all_reduce_sum(totals, context)
    # The slowest rank sets the pace of synchronous data-parallel steps.
    seconds = float(all_reduce_sum(torch.tensor([seconds], dtype=torch.float64), context)[0]) / context.world_size
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
        },
        "target": str(config.target),
        "data": str(config.data),
    }
    if context.is_main:
        out_dir = Path(config.out)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out_dir / BENCHMARK_FILE, result, indent=1)
    barrier(context)
    return result
