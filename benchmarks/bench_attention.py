"""Benchmark: the drafter's training attention, dense mask (reference) vs block-sparse tiles.

One forward+backward of `block_attention` (queries = N blocks of B, keys = [T context | N*B
blocks], after q/k-norm and RoPE; the projections around it are the same for every path) at:
  - the paper's shape: T 3072, N 512 anchors, B 16, one sequence;
  - the demo's shape: the tiny target's heads (4 query / 2 kv, head dim 32), block 16, a micro-batch
    of 4 sequences of about 220 tokens (prompt + 192 generated) whose every response position is an
    anchor (the demo caps anchors at 512, more than a sequence has).
Dense and sparse (the default, and with tiles kept / recomputed in backward forced) run in the same
process on the same inputs; the script prints time, peak memory and their ratios. Peak memory is the process's resident high-water mark above what was resident
before the call (Linux: VmHWM after resetting it through /proc/self/clear_refs; glibc is told to
return large blocks to the system so a freed tensor does not hide the next one's growth).

A real drafter's heads (e.g. 32 x 128) do not fit a 2-core CPU's time at the paper's shape, so the
paper's shape runs with --heads/--kv-heads/--head-dim reduced (default 4/1/64); the sequence and
block shape, which set the mask and the visible-key count, are the real ones. The analytic lines
give dense vs sparse attention-score entries at the real head count.

    PYTHONPATH=src python benchmarks/bench_attention.py [--shape paper|demo|both] [--threads 1]
    PYTHONPATH=src python benchmarks/bench_attention.py --shape paper --tiles 64,128,256,512
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import time
from dataclasses import replace
from pathlib import Path

import torch

from draftsmith.model.block_attention import BlockLayout, _tile_plan, block_attention, recomputes_tiles

PROC_STATUS = Path("/proc/self/status")


def _return_freed_memory_to_the_system() -> None:
    # glibc otherwise raises its mmap threshold after big frees and keeps the pages resident.
    try:
        ctypes.CDLL("libc.so.6").mallopt(-3, 1 << 16)  # M_MMAP_THRESHOLD = 64 KiB
    except OSError:
        pass


def _status_kib(field: str) -> int:
    for line in PROC_STATUS.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} missing from {PROC_STATUS}")


def measure(fn, repeats: int, reset=lambda: None) -> tuple[float, float, float]:
    """(best wall seconds, best CPU seconds, peak MiB above the resident baseline) of fn().

    CPU seconds (this process's user+system time) are the steadier number on a shared machine:
    waiting for a core does not count. Ratios use them.
    """
    best_wall, best_cpu, peak = float("inf"), float("inf"), 0.0
    for _ in range(repeats):
        reset()
        gc.collect()
        baseline = _status_kib("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        best_cpu = min(best_cpu, time.process_time() - cpu)
        best_wall = min(best_wall, time.perf_counter() - wall)
        peak = max(peak, (_status_kib("VmHWM") - baseline) / 1024)
    return best_wall, best_cpu, peak


def paper_layout(context: int, anchors: int, block: int, seed: int) -> BlockLayout:
    generator = torch.Generator().manual_seed(seed)
    # Anchors on the response (the last 85% of the sequence), distinct and sorted as the trainer draws them.
    response_start = int(context * 0.15)
    picked = response_start + torch.randperm(context - response_start - 1, generator=generator)[:anchors]
    chosen = picked.sort().values[None]
    return BlockLayout(chosen, torch.ones_like(chosen, dtype=torch.bool), context, block)


def demo_layout(batch: int, block: int, seed: int) -> BlockLayout:
    generator = torch.Generator().manual_seed(seed)
    lengths = [int(x) for x in torch.randint(190, 230, (batch,), generator=generator)]
    prompts = [int(x) for x in torch.randint(20, 40, (batch,), generator=generator)]
    counts = [length - prompt - 1 for length, prompt in zip(lengths, prompts)]
    most = max(counts)
    anchors = torch.zeros(batch, most, dtype=torch.long)
    valid = torch.zeros(batch, most, dtype=torch.bool)
    for row, (prompt, count) in enumerate(zip(prompts, counts)):
        anchors[row, :count] = torch.arange(prompt, prompt + count)
        valid[row, :count] = True
    return BlockLayout(anchors, valid, max(lengths), block)


def visible_entries(layout: BlockLayout) -> tuple[int, int]:
    """(dense, sparse) score entries per head: what each path multiplies out."""
    sequences = layout.anchors.shape[0]
    dense = sequences * layout.num_queries * (layout.context_length + layout.num_queries)
    sparse = sum(sequences * (end - start) * layout.block_size * (prefix + (end - start) * layout.block_size)
                 for start, end, prefix, _ in _tile_plan(layout))
    return dense, sparse


def run_shape(name: str, layout: BlockLayout, heads: int, kv_heads: int, head_dim: int, repeats: int,
              real_heads: int | None) -> None:
    generator = torch.Generator().manual_seed(0)
    sequences, keys = layout.anchors.shape[0], layout.context_length + layout.num_queries
    query = torch.randn(sequences, heads, layout.num_queries, head_dim, generator=generator, requires_grad=True)
    key = torch.randn(sequences, kv_heads, keys, head_dim, generator=generator, requires_grad=True)
    value = torch.randn(sequences, kv_heads, keys, head_dim, generator=generator, requires_grad=True)
    scale = head_dim**-0.5

    def reset():
        for tensor in (query, key, value):
            tensor.grad = None

    variants = {
        "dense": layout.with_mode("dense"),
        "sparse": layout.with_mode("sparse"),
        "sparse, tiles kept": replace(layout.with_mode("sparse"), recompute_tiles=False),
        "sparse, recompute": replace(layout.with_mode("sparse"), recompute_tiles=True),
    }

    def step(variant: BlockLayout):
        def call():
            # A fresh layout per step: building the mask / the tile plan is part of the cost.
            block_attention(query, key, value, replace(variant, _cache={}), scale).sum().backward()
        return call

    print(f"{name}: S {sequences}, T {layout.context_length}, N {layout.num_blocks}, B {layout.block_size} "
          f"(queries {layout.num_queries}, keys {keys}), heads {heads}/{kv_heads} x {head_dim}, "
          f"{torch.get_num_threads()} thread(s), best of {repeats}")
    step(variants["sparse"])()  # warm-up: first-call allocations and kernel selection
    print(f"  (sparse = the default: tiles {'recomputed' if recomputes_tiles(layout) else 'kept'} by the rule)")
    results = {name: measure(step(variant), repeats, reset) for name, variant in variants.items()}
    _, dense_cpu, dense_mib = results["dense"]
    for name, (wall, cpu, peak) in results.items():
        ratios = "" if name == "dense" else f"   dense/this: CPU time {dense_cpu / cpu:.2f}x, memory {dense_mib / max(peak, 1e-9):.2f}x"
        print(f"  {name:<18}: CPU {cpu * 1e3:8.1f} ms (wall {wall * 1e3:8.1f}) fwd+bwd, peak +{peak:7.1f} MiB{ratios}")
    dense_entries, sparse_entries = visible_entries(layout)
    print(f"  score entries per head: dense {dense_entries / 1e6:.1f} M, sparse {sparse_entries / 1e6:.1f} M "
          f"({dense_entries / sparse_entries:.2f}x)")
    if real_heads:
        # Saved for backward by one layer at a real drafter's heads in bf16 with fused kernels
        # (CUDA repeats kv heads for masked kernels), and the score matrices an unfused kernel makes.
        mib, width = 2**20, real_heads * 128 * 2
        keys_kept = sum(sequences * (prefix + (end - start) * layout.block_size) for start, end, prefix, _ in _tile_plan(layout))
        print(f"  analytic, {real_heads} heads x 128, bf16, per layer: dense mask {dense_entries / mib:.0f} MiB + K/V "
              f"{2 * sequences * keys * width / mib:.0f} MiB; sparse tile masks {sparse_entries / mib:.0f} MiB + K/V copies "
              f"{2 * keys_kept * width / mib:.0f} MiB kept (one tile's if recomputed); unfused fp32 scores: "
              f"dense {dense_entries * real_heads * 4 / 2**30:.1f} GiB, sparse {sparse_entries * real_heads * 4 / 2**30:.1f} GiB")


def sweep_tiles(layout: BlockLayout, tiles: list[int], heads: int, kv_heads: int, head_dim: int, repeats: int) -> None:
    generator = torch.Generator().manual_seed(0)
    keys = layout.context_length + layout.num_queries
    sequences = layout.anchors.shape[0]
    query = torch.randn(sequences, heads, layout.num_queries, head_dim, generator=generator, requires_grad=True)
    key = torch.randn(sequences, kv_heads, keys, head_dim, generator=generator, requires_grad=True)
    value = torch.randn(sequences, kv_heads, keys, head_dim, generator=generator, requires_grad=True)
    print(f"tile sweep (sparse, T {layout.context_length}, N {layout.num_blocks}, B {layout.block_size}):")
    for tile in tiles:
        tiled = BlockLayout(layout.anchors, layout.anchor_valid, layout.context_length, layout.block_size, tile_queries=tile)

        def call():
            block_attention(query, key, value, tiled.with_mode("sparse"), head_dim**-0.5).sum().backward()

        def reset():
            for tensor in (query, key, value):
                tensor.grad = None

        _, cpu, peak = measure(call, repeats, reset)
        _, entries = visible_entries(tiled)
        print(f"  tile {tile:5d} queries: CPU {cpu * 1e3:8.1f} ms, peak +{peak:7.1f} MiB, {entries / 1e6:.1f} M entries/head")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shape", choices=["paper", "demo", "both"], default="both")
    parser.add_argument("--heads", type=int, default=4, help="query heads at the paper's shape")
    parser.add_argument("--kv-heads", type=int, default=1)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--real-heads", type=int, default=32, help="head count for the analytic memory line")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--tiles", type=str, default=None, help="comma-separated tile sizes to sweep (sparse only)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    _return_freed_memory_to_the_system()

    paper = paper_layout(3072, 512, 16, seed=0)
    if args.tiles:
        sweep_tiles(paper, [int(x) for x in args.tiles.split(",")], args.heads, args.kv_heads, args.head_dim, args.repeats)
        return
    if args.shape in ("demo", "both"):
        run_shape("demo", demo_layout(4, 16, seed=0), 4, 2, 32, args.repeats + 1, None)
    if args.shape in ("paper", "both"):
        run_shape("paper", paper, args.heads, args.kv_heads, args.head_dim, args.repeats, args.real_heads)


if __name__ == "__main__":
    main()
