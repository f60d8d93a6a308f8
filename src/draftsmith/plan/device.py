"""`draftsmith plan device --measure`: the device this machine is, as a catalogue entry.

It times what the roofline needs, with torch on the device it runs on (a CUDA GPU when there is one,
else the CPU):

- memory bandwidth: `dst.copy_(src)` of a buffer far larger than the caches (read + write bytes per
  copy, the best of several repeats: what a memory-bound step can reach);
- matmul peaks: square bf16 and fp32 matmuls, 2·n³ FLOPs each (bf16 is emulated, and slow, on CPUs
  without AVX512-BF16/AMX: the figure says so rather than the datasheet);
- memory: the GPU's, or the machine's RAM for a CPU.

The entry is a `GpuSpec` (plan/gpus.py, the one catalogue) written as JSON, so `--gpu FILE` works
wherever `--gpu NAME` does (`plan engine`, `plan speculation`, `plan train`). An engine's fixed cost
per decode step (`step_overhead_s`: scheduling, Python, kernel launches, which a CPU engine pays in
full and CUDA graphs hide on a GPU) is no property of torch kernels; `--step-overhead` records one
measured against a real engine (benchmarks/bench_speculation.py does), 0 when not given.
"""

from __future__ import annotations

import os
import platform
from contextlib import nullcontext
import re
import sys
import time
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

from draftsmith.core.config import Threads, cli
from draftsmith.core.errors import InputError
from draftsmith.core.io import disk_full_as_one_line, dumps_json, write_json_atomic
from draftsmith.core.limits import choose_threads
from draftsmith.core.lock import lock_output_file
from draftsmith.plan.gpus import DEVICE_KIND, DEVICE_VERSION, GpuSpec, device_dict, is_device_path, load_device

__all__ = ["DEVICE_KIND", "DEVICE_VERSION", "device_dict", "is_device_path", "load_device", "measure_device",
           "plan_device", "parse_seconds"]

COPY_BYTES = {"cpu": 256 * 2**20, "cuda": 2 * 2**30}  # far above any cache (8 MiB L3 here, 50 MiB on an H100)
MATMUL_SIZE = {"cpu": 1024, "cuda": 8192}
REPEATS = 5


class DevicePlanConfig(BaseModel):
    """`draftsmith plan device`: measure this machine's bandwidth, matmul peaks and memory as a device entry."""

    model_config = ConfigDict(extra="forbid")

    measure: bool = Field(False, description="time a memory-bound copy and bf16/fp32 matmuls here")
    out: Annotated[Path | None, cli(metavar="FILE")] = Field(
        None, description="write the device entry here (JSON; pass it as --gpu FILE)")
    torch_device: Annotated[str | None, cli(metavar="DEVICE")] = Field(
        None, description="torch device to measure: cpu or cuda (cuda when available)")
    name: Annotated[str | None, cli(metavar="NAME")] = Field(None, description="the entry's name (this host's)")
    step_overhead: Annotated[str | None, cli(metavar="DURATION")] = Field(
        None, description="an engine's fixed cost per decode step measured on this device ('1.6ms')")
    threads: Annotated[Threads | None, cli(metavar="N")] = Field(None, description="torch CPU threads (default: one per CPU the machine's 1-minute load leaves idle, printed; at most 4 per CPU)")


_SECONDS = re.compile(r"^\s*(?P<number>\d+(?:\.\d*)?|\.\d+)\s*(?P<unit>s|ms|us|µs)\s*$")
_UNIT_SECONDS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}


def parse_seconds(text: Any, flag: str) -> float:
    """A short duration with its unit ('1.6ms', '250us', '0.002s'), 0 or more."""
    match = _SECONDS.match(str(text))
    if not match:
        raise InputError(f"{flag} {text!r}: expected a duration with its unit, e.g. '1.6ms', '250us' or '0.002s'")
    return float(match["number"]) * _UNIT_SECONDS[match["unit"]]


def _best_seconds(run, repeats: int, synchronize) -> float:
    run()  # warm-up: allocation, first-touch page faults, kernel selection
    synchronize()
    best = float("inf")
    for _ in range(repeats):
        began = time.perf_counter()
        run()
        synchronize()
        best = min(best, time.perf_counter() - began)
    return best


def measure_bandwidth(torch_device: str, size_bytes: int, repeats: int = REPEATS) -> float:
    """Bytes/s of a large copy (each copy reads and writes `size_bytes`)."""
    import torch

    synchronize = torch.cuda.synchronize if torch_device.startswith("cuda") else (lambda: None)
    source = torch.ones(size_bytes // 4, dtype=torch.float32, device=torch_device)
    target = torch.empty_like(source)
    seconds = _best_seconds(lambda: target.copy_(source), repeats, synchronize)
    return 2 * size_bytes / seconds


def measure_matmul(torch_device: str, dtype_name: str, size: int, repeats: int = REPEATS) -> float:
    """FLOP/s of a square `size` matmul in `dtype_name` (2·size³ FLOPs)."""
    import torch

    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype_name]
    synchronize = torch.cuda.synchronize if torch_device.startswith("cuda") else (lambda: None)
    generator = torch.Generator(device=torch_device).manual_seed(0)
    a = torch.randn(size, size, generator=generator, device=torch_device).to(dtype)
    b = torch.randn(size, size, generator=generator, device=torch_device).to(dtype)
    seconds = _best_seconds(lambda: torch.matmul(a, b), repeats, synchronize)
    return 2 * size**3 / seconds


def _memory_bytes(torch_device: str) -> int:
    import torch

    if torch_device.startswith("cuda"):
        return int(torch.cuda.get_device_properties(torch.device(torch_device)).total_memory)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def _device_title(torch_device: str) -> str:
    import torch

    if torch_device.startswith("cuda"):
        return torch.cuda.get_device_name(torch.device(torch_device))
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model} CPU, {torch.get_num_threads()} threads"


def measure_device(torch_device: str | None = None, name: str | None = None, step_overhead_s: float = 0.0,
                   threads: int | None = None, copy_bytes: int | None = None, matmul_size: int | None = None) -> GpuSpec:
    """This machine as a `GpuSpec`: measured copy bandwidth, bf16/fp32 matmul rates and memory."""
    import torch

    if torch_device is None:
        torch_device = "cuda" if torch.cuda.is_available() else "cpu"
    if torch_device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"--torch-device {torch_device}: torch sees no CUDA device here")
    if torch_device != "cpu" and not torch_device.startswith("cuda"):
        raise InputError(f"--torch-device {torch_device!r}: expected cpu or cuda")
    family = "cuda" if torch_device.startswith("cuda") else "cpu"
    # A CPU measured with every core on a busy machine measures the load (threads from it unless asked).
    _, threads_line = choose_threads(threads, on_cpu=family == "cpu")
    if threads_line:
        print(f"plan device: {threads_line}", file=sys.stderr, flush=True)
    bandwidth = measure_bandwidth(torch_device, copy_bytes or COPY_BYTES[family])
    size = matmul_size or MATMUL_SIZE[family]
    # Without native bf16 (no AVX512-BF16/AMX) a CPU emulates it some 30x slower: a smaller matrix keeps
    # the measurement to seconds and still far beyond call overhead.
    bf16_size = size if family == "cuda" else max(size // 2, 64)
    bf16, fp32 = measure_matmul(torch_device, "bf16", bf16_size), measure_matmul(torch_device, "fp32", size)
    title = _device_title(torch_device)
    return GpuSpec(
        name=name or f"{platform.node() or 'this-machine'}-{family}", title=f"{title} (measured)",
        memory_bytes=_memory_bytes(torch_device), bandwidth_bytes_per_s=bandwidth, bf16_flops=bf16, fp32_flops=fp32,
        nvlink=False, link_bytes_per_s=0.0, step_overhead_s=step_overhead_s,
        measured=(f"torch {torch.__version__} on {torch_device}, {time.strftime('%Y-%m-%d %H:%M:%S %Z')}: best of "
                  f"{REPEATS} copies of {(copy_bytes or COPY_BYTES[family]) / 2**20:,.0f} MiB, {size}x{size} matmuls"),
    )


def plan_device(config: DevicePlanConfig, as_json: bool = False) -> GpuSpec:
    """`plan device`: measure (with --measure) and print the entry; write it to --out."""
    if not config.measure:
        raise InputError("plan device needs --measure (it times this machine; catalogue GPUs need no entry)")
    overhead = 0.0 if config.step_overhead is None else parse_seconds(config.step_overhead, "--step-overhead")
    # --out is checked (and held) before the measurement: a directory or an unwritable place there is
    # one line naming it now, not a temporary file's error after a minute of measuring.
    with lock_output_file(config.out, "plan device", example="device.json") if config.out else nullcontext():
        device = measure_device(config.torch_device, config.name, overhead, config.threads)
        if config.out is not None:
            with disk_full_as_one_line(config.out):
                write_json_atomic(config.out, device_dict(device))
    if as_json:
        print(dumps_json(device_dict(device)))
    else:
        flops32 = f"{device.fp32_flops / 1e12:,.3f}" if device.fp32_flops else "-"
        print(f"{device.title}: memory {device.memory_bytes / 1e9:,.1f} GB, copy bandwidth "
              f"{device.bandwidth_bytes_per_s / 1e9:,.1f} GB/s, matmul bf16 {device.bf16_flops / 1e12:,.3f} / fp32 "
              f"{flops32} TFLOP/s, step overhead {device.step_overhead_s * 1e3:g} ms"
              + (f"; written to {config.out} (pass it as --gpu {config.out})" if config.out else ""))
    return device
