"""The one GPU catalogue of the plan room: memory, memory bandwidth and dense tensor-core peaks.

`plan train` reads its bf16 peak and memory, `plan engine` all of it. Peaks are dense (no 2:4
sparsity), per GPU, in FLOP/s; memory in bytes (GB = 1e9, as the vendors sell it); bandwidth in
bytes/s. A dtype the GPU has no tensor-core path for is None (A100: no FP8; Hopper/Ada: no FP4).

Sources (vendor datasheets; sparse figures halved to dense):
- H100 SXM5, H200 SXM: NVIDIA H100/H200 datasheets: 80 GB HBM3 at 3.35 TB/s and 141 GB HBM3e at
  4.8 TB/s; bf16 1,979 / FP8 3,958 TFLOPS with sparsity -> 989 / 1,979 dense.
- B200 (HGX): NVIDIA HGX B200 spec: 1,440 GB and 62 TB/s for 8 GPUs -> 180 GB, ~7.7 TB/s each;
  FP16/BF16 36 PF, FP8 72 PF, FP4 144 PF sparse for 8 -> 2,250 / 4,500 / 9,000 TFLOPS dense each.
- A100 80GB SXM: NVIDIA A100 datasheet: 2,039 GB/s, bf16 312 TFLOPS dense.
- L40S: NVIDIA L40S datasheet: 48 GB GDDR6 at 864 GB/s; bf16 362 / FP8 733 TFLOPS dense
  (733 / 1,466 with sparsity).
- RTX PRO 6000 Blackwell: NVIDIA datasheets: 96 GB GDDR7, 512-bit; Workstation 1,792 GB/s
  (28 Gbps), Server Edition 1,597 GB/s; "4 PFLOPS" FP4 with sparsity -> ~2,000 dense FP4, ~1,000
  FP8, ~500 bf16 at the Workstation's boost clock; the Server Edition's lower clock gives ~480 bf16.
  These two are approximate (to a few percent); pass --gpu-tflops to plan on a measured figure.
Both RTX PRO 6000 and L40S have no NVLink: tensor parallelism runs its all-reduces over PCIe.

A device measured here (`draftsmith plan device --measure`, plan/device.py) is a JSON file holding one
`GpuSpec`; wherever a plan takes `--gpu NAME` it takes that file's path too.
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from draftsmith.core.errors import InputError
from draftsmith.core.readers import BadJSONError, read_json

T = 1e12
DEVICE_KIND = "draftsmith.plan.device"
DEVICE_VERSION = 1
GB = 10**9
MAX_DEVICE_FILE_BYTES = 2**20  # a device entry is a dozen figures


class GpuSpec(BaseModel):
    name: str
    title: str
    memory_bytes: int
    bandwidth_bytes_per_s: float
    bf16_flops: float
    fp8_flops: float | None = None
    fp4_flops: float | None = None
    nvlink: bool = True
    # One direction of the link tensor parallelism all-reduces over: NVLink 4 (H100/H200) 450 GB/s,
    # NVLink 5 (B200) 900 GB/s, NVLink 3 (A100) 300 GB/s; PCIe 5.0 x16 64 GB/s (RTX PRO 6000), PCIe 4.0 x16
    # 32 GB/s (L40S).
    link_bytes_per_s: float = 450e9
    aliases: tuple[str, ...] = ()
    # A measured device (plan/device.py) also knows its fp32 matmul rate, an engine's fixed cost per
    # decode step that the roofline does not see (scheduling, Python, kernel launches: large on a CPU
    # engine, hidden by CUDA graphs on a GPU) and how the figures were obtained.
    fp32_flops: float | None = None
    step_overhead_s: float = 0.0
    # The part of it each running request adds (its sampling, detokenizing and output processing: vLLM
    # CPU's plain step grows from 10.7 ms at batch 1 to 17.6 ms at batch 8 on a 0.2M-parameter model).
    request_overhead_s: float = 0.0
    # What a speculative step adds to that on such an engine: the drafter's own forward launch and the
    # proposer's and rejection sampler's bookkeeping, fixed and per running request (vLLM CPU's DFlash
    # and n-gram paths both add about 4.7 ms at batch 1; benchmarks/bench_speculation.py).
    draft_step_overhead_s: float = 0.0
    draft_request_overhead_s: float = 0.0
    # And what the drafter's forward costs beyond its roofline per running request and drafted token
    # (n-gram has no forward): vLLM CPU's DFlash step grows 8 ms from K=1 to K=7 at batch 8 on the tiny
    # target where its n-gram step at K=7 and its batch-1 steps do not grow at all.
    draft_token_overhead_s: float = 0.0
    measured: str | None = None

    def peak_flops(self, weights: str) -> float:
        """The tensor-core peak a step runs at with `weights`: FP8/FP4 weights use FP8/FP4 math where the
        GPU has it; otherwise (and for int4, which engines run as W4A16) the weights are dequantized to bf16."""
        if weights == "fp8" and self.fp8_flops:
            return self.fp8_flops
        if weights == "fp4" and self.fp4_flops:
            return self.fp4_flops
        return self.bf16_flops


GPUS: tuple[GpuSpec, ...] = (
    GpuSpec(name="rtx-pro-6000-server", title="RTX PRO 6000 Blackwell Server Edition", memory_bytes=96 * GB,
            bandwidth_bytes_per_s=1597e9, bf16_flops=480 * T, fp8_flops=960 * T, fp4_flops=1920 * T, nvlink=False, link_bytes_per_s=64e9,
            aliases=("rtx-pro-6000", "rtx-pro-6000-blackwell-server")),
    GpuSpec(name="rtx-pro-6000-workstation", title="RTX PRO 6000 Blackwell Workstation Edition", memory_bytes=96 * GB,
            bandwidth_bytes_per_s=1792e9, bf16_flops=504 * T, fp8_flops=1008 * T, fp4_flops=2016 * T, nvlink=False, link_bytes_per_s=64e9,
            aliases=("rtx-pro-6000-blackwell-workstation",)),
    GpuSpec(name="h100", title="H100 SXM5 80GB", memory_bytes=80 * GB, bandwidth_bytes_per_s=3350e9,
            bf16_flops=989 * T, fp8_flops=1979 * T, aliases=("h100-sxm", "h100-80gb")),
    GpuSpec(name="h200", title="H200 SXM 141GB", memory_bytes=141 * GB, bandwidth_bytes_per_s=4800e9,
            bf16_flops=989 * T, fp8_flops=1979 * T, aliases=("h200-sxm",)),
    GpuSpec(name="b200", title="B200 (HGX) 180GB", memory_bytes=180 * GB, bandwidth_bytes_per_s=7700e9,
            bf16_flops=2250 * T, fp8_flops=4500 * T, fp4_flops=9000 * T, link_bytes_per_s=900e9),
    GpuSpec(name="a100-80gb", title="A100 80GB SXM", memory_bytes=80 * GB, bandwidth_bytes_per_s=2039e9,
            bf16_flops=312 * T, link_bytes_per_s=300e9, aliases=("a100", "a100-sxm")),
    GpuSpec(name="l40s", title="L40S 48GB", memory_bytes=48 * GB, bandwidth_bytes_per_s=864e9,
            bf16_flops=362 * T, fp8_flops=733 * T, nvlink=False, link_bytes_per_s=32e9),
)


def gpu_names() -> list[str]:
    return [gpu.name for gpu in GPUS]


def find_gpu(name: str, flag: str = "--gpu", instead: str = "--gpu-bandwidth, --gpu-memory and --gpu-tflops") -> GpuSpec:
    """The catalogue entry for `name` (case and `_`/space insensitive, aliases accepted), or the device
    a `plan device --measure` file holds when `name` is the path of one."""
    if is_device_path(name):
        return load_device(name, flag)
    key = str(name).strip().lower().replace("_", "-").replace(" ", "-")
    for gpu in GPUS:
        if key == gpu.name or key in gpu.aliases:
            return gpu
    raise InputError(f"{flag} {name!r}: unknown GPU (known: {', '.join(gpu_names())}); "
                     f"or a device file from `draftsmith plan device --measure`, or give {instead}")


def is_device_path(name: Any) -> bool:
    """Whether `--gpu` names a device file rather than a catalogue entry."""
    text = str(name)
    return text.endswith(".json") or os.sep in text or Path(text).is_file()


def load_device(path: str | Path, flag: str = "--gpu") -> GpuSpec:
    """The `GpuSpec` a device file holds, or one line naming the file and what is wrong with it."""
    path = Path(path)
    try:  # the shared reader: a plain file of bounded size and depth (a FIFO or /dev/zero is one line)
        data = read_json(path, "device file", max_bytes=MAX_DEVICE_FILE_BYTES, missing_ok=True)
    except BadJSONError as error:
        raise InputError(f"{flag} {path}: not a device file: {str(error).removeprefix(str(path) + ':').strip()}") from None
    except InputError as error:
        raise InputError(f"{flag} {error}") from None
    if data is None:
        raise InputError(f"{flag} {path}: no such device file (write one with `draftsmith plan device --measure --out "
                         f"{path}`)")
    if not isinstance(data, dict) or data.get("kind") != DEVICE_KIND:
        found = data.get("kind") if isinstance(data, dict) else type(data).__name__
        raise InputError(f"{flag} {path}: not a device file (field 'kind' is {found!r}, expected {DEVICE_KIND!r})")
    if data.get("version") != DEVICE_VERSION:
        raise InputError(f"{flag} {path}: unsupported device file version {data.get('version')!r} "
                         f"(this reads {DEVICE_VERSION})")
    fields = {key: value for key, value in data.items() if key not in ("kind", "version")}
    try:
        device = GpuSpec(**fields)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "entry"
        raise InputError(f"{flag} {path}: field {where!r}: {first['msg']}") from None
    return check_device(device, f"{flag} {path}: field ")


# What a device entry's figures may be (a file is someone's measurement, or someone's edit of one):
# each finite, within (lowest, highest]; lowest 0 means "0 or more". The ceilings are generous past
# any device made (an H200 reads 4.8e12 B/s, a B200 does 9e15 FP4 FLOP/s): a figure beyond them
# is a typo, and a NaN or infinite one turns every plan into "nan tok/s" or "0 tok/s".
DEVICE_FIELD_RANGES: dict[str, tuple[float, float, bool]] = {
    "memory_bytes": (0, 1e15, False),  # 1 PB on one device
    "bandwidth_bytes_per_s": (0, 1e15, False),  # 1 PB/s
    "bf16_flops": (0, 1e18, False), "fp8_flops": (0, 1e18, False), "fp4_flops": (0, 1e18, False),
    "fp32_flops": (0, 1e18, False),
    "link_bytes_per_s": (0, 1e15, True),
    # No engine spends a minute of fixed cost per decode step.
    "step_overhead_s": (0, 60.0, True), "request_overhead_s": (0, 60.0, True),
    "draft_step_overhead_s": (0, 60.0, True), "draft_request_overhead_s": (0, 60.0, True),
    "draft_token_overhead_s": (0, 60.0, True),
}  # fmt: skip


def check_device(device: GpuSpec, where: str = "") -> GpuSpec:
    """``device`` when each of its figures is finite and in its `DEVICE_FIELD_RANGES` range; else one
    line, ``where`` (e.g. ``"--gpu FILE: field "``) then the field and the problem."""
    for field, (lowest, highest, zero_ok) in DEVICE_FIELD_RANGES.items():
        value = getattr(device, field)
        if value is None:
            continue
        if not math.isfinite(value):
            raise InputError(f"{where}{field!r} must be a finite number, got {value!r}")
        if zero_ok and value < lowest:
            raise InputError(f"{where}{field!r} must be 0 or more, got {value!r}")
        if not zero_ok and not value > lowest:
            raise InputError(f"{where}{field!r} must be positive, got {value!r}")
        if value > highest:
            raise InputError(f"{where}{field!r} is {value:.3g}, beyond any device (at most {highest:.0e})")
    return device


def device_dict(device: GpuSpec) -> dict[str, Any]:
    return {"kind": DEVICE_KIND, "version": DEVICE_VERSION, **device.model_dump(mode="json")}
