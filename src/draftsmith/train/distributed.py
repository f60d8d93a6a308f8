"""Process-group plumbing for `torchrun` (DDP): gloo on CPU, NCCL on CUDA.

Launched without torchrun, everything here degrades to a single process with no process group.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist


# NCCL's default is 10 minutes; writing a 30-40 GB checkpoint to a network disk can take longer.
PROCESS_GROUP_TIMEOUT = timedelta(seconds=int(os.environ.get("DRAFTSMITH_DIST_TIMEOUT_S", "3600")))


@dataclass(frozen=True)
class DistributedContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    initialized_here: bool

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", local_rank)
    return device


def init_distributed(device_name: str = "auto") -> DistributedContext:
    """Join the process group that torchrun describes in the environment, if any."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_name, local_rank)
    initialized_here = False
    if world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        # Long enough for rank 0 to write a large checkpoint while the others wait in a barrier.
        dist.init_process_group(backend=backend, timeout=PROCESS_GROUP_TIMEOUT)
        initialized_here = True
    return DistributedContext(rank, world_size, local_rank, device, initialized_here)


def shutdown(context: DistributedContext) -> None:
    if context.initialized_here and dist.is_initialized():
        dist.destroy_process_group()


def _all_reduce(values: torch.Tensor, context: DistributedContext, op) -> torch.Tensor:
    """`values` reduced over the ranks (a copy on the collective's device, returned where it was)."""
    if not context.enabled:
        return values
    reduced = values.detach().clone().to(context.device)
    dist.all_reduce(reduced, op=op)
    return reduced.to(values.device)


def all_reduce_sum(values: torch.Tensor, context: DistributedContext) -> torch.Tensor:
    return _all_reduce(values, context, dist.ReduceOp.SUM)


def all_reduce_max(values: torch.Tensor, context: DistributedContext) -> torch.Tensor:
    return _all_reduce(values, context, dist.ReduceOp.MAX)


def barrier(context: DistributedContext) -> None:
    if context.enabled:
        dist.barrier()


def parameter_checksum(module: torch.nn.Module) -> float:
    """A position-sensitive digest of the parameters; equal on every rank when DDP kept them in sync
    (under FSDP the whole parameters are gathered first, so every rank must call it)."""
    total = torch.zeros((), dtype=torch.float64)
    for index, parameter in enumerate(module.parameters()):
        values = parameter.detach()
        if hasattr(values, "full_tensor"):  # an FSDP2 shard (DTensor): gathered, collective on every rank
            values = values.full_tensor()
        values = values.to("cpu", torch.float64).flatten()
        ramp = torch.linspace(1.0, 2.0, values.numel(), dtype=torch.float64)
        total += (index + 1) * (values * ramp).sum()
    return float(total)


def gather_floats(value: float, context: DistributedContext) -> list[float]:
    if not context.enabled:
        return [value]
    tensor = torch.tensor([value], dtype=torch.float64, device=context.device)
    gathered = [torch.zeros_like(tensor) for _ in range(context.world_size)]
    dist.all_gather(gathered, tensor)
    return [float(item.item()) for item in gathered]


def broadcast_object(obj, context: DistributedContext):
    if not context.enabled:
        return obj
    holder = [obj]
    dist.broadcast_object_list(holder, src=0)
    return holder[0]
