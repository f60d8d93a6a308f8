"""Data parallelism for the drafter: `--sharding ddp` (replicated) or `--sharding fsdp` (FSDP2).

DDP keeps a full drafter and optimizer on every rank and averages gradients in buckets that are
the gradients themselves (`gradient_as_bucket_view`, no second copy). FSDP2 (`fully_shard`) shards
each drafter layer and the remaining drafter parameters (fc, norms) over the ranks, so parameters,
gradients and AdamW state cost 1/G of the replicated run per rank; reduce-scatter averages the
gradients like DDP does, so both give the same loss. The frozen target's decoder layers are sharded
too (the embedding and LM head, which the drafter calls outside the target's forward, stay whole).
Without a process group (one process) both modes run the plain module.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from draftsmith.train.distributed import DistributedContext

SHARDINGS = ("ddp", "fsdp")


def _mesh(context: DistributedContext):
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(context.device.type, (context.world_size,))


def parallelize_drafter(drafter: nn.Module, context: DistributedContext, sharding: str) -> nn.Module:
    """The module the loop calls: `drafter` itself (one process, or FSDP2 in place) or a DDP wrapper."""
    if not context.enabled:
        return drafter
    if sharding == "fsdp":
        from torch.distributed.fsdp import fully_shard

        mesh = _mesh(context)
        for layer in drafter.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(drafter, mesh=mesh)
        return drafter
    from torch.nn.parallel import DistributedDataParallel

    device_ids = [context.device.index] if context.device.type == "cuda" else None
    return DistributedDataParallel(drafter, device_ids=device_ids, gradient_as_bucket_view=True)


def shard_target(target: nn.Module, context: DistributedContext, sharding: str) -> None:
    """FSDP2 over the frozen target's decoder layers (each gathered for its own forward, then freed)."""
    if not context.enabled or sharding != "fsdp":
        return
    from torch.distributed.fsdp import fully_shard

    from draftsmith.model.features import decoder_layers

    mesh = _mesh(context)
    for layer in decoder_layers(target):
        fully_shard(layer, mesh=mesh)


def is_sharded(model: nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def gradient_sync(model: nn.Module, enabled: bool):
    """Skip the gradient all-reduce / reduce-scatter on micro-batches before the last of a step."""
    if is_sharded(model):
        model.set_requires_gradient_sync(enabled)
        return contextlib.nullcontext()
    if enabled or not hasattr(model, "no_sync"):
        return contextlib.nullcontext()
    return model.no_sync()


def clip_gradients(parameters, max_norm: float) -> torch.Tensor:
    """Clip to `max_norm` (inf: measure only); the global norm as a local tensor, no host sync."""
    norm = torch.nn.utils.clip_grad_norm_(parameters, max_norm if max_norm > 0 else float("inf"), foreach=True)
    return norm.full_tensor() if hasattr(norm, "full_tensor") else norm


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The drafter's whole state on CPU (gathered from the shards under FSDP; collective there)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    if not is_sharded(model):
        inner = getattr(model, "module", model)
        return {name: tensor.detach().cpu() for name, tensor in inner.state_dict().items()}
    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
