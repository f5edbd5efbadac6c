"""All distributed setup lives here. One process (plain `nlq train`) and torchrun (RANK, WORLD_SIZE,
LOCAL_RANK in the environment) run the same training code; only rank 0 prints and writes."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
from torch import nn

from nlq.config import DistConfig
from nlq.errors import UserError


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")
    group: bool = False  # in a process group (started by torchrun), even a world of one

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.group or self.world > 1


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    if name == "auto":
        return torch.device(f"cuda:{local_rank}") if torch.cuda.is_available() else torch.device("cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"train.device={name} but no CUDA device is available; use --train.device=cpu or auto")
        if device.index is None:
            device = torch.device(f"cuda:{local_rank}")
    return device


def init(cfg: DistConfig, device_name: str) -> DistEnv:
    """Join the process group when torchrun started us (RANK, WORLD_SIZE, MASTER_ADDR set; with
    --nproc_per_node=1 too, so DDP/FSDP run as they would on more processes); otherwise a plain process."""
    launched = all(v in os.environ for v in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"))
    world = int(os.environ.get("WORLD_SIZE", "1")) if launched else 1
    rank, local_rank = (int(os.environ.get(v, "0")) for v in ("RANK", "LOCAL_RANK")) if launched else (0, 0)
    device = resolve_device(device_name, local_rank)
    if launched and not dist.is_initialized():
        backend = cfg.backend if cfg.backend != "auto" else ("nccl" if device.type == "cuda" else "gloo")
        if device.type == "cuda":
            torch.cuda.set_device(device)
        # the timeout turns a dead peer into an error on the survivors instead of a hang
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=cfg.timeout_s))
    return DistEnv(rank, world, local_rank, device, group=launched)


def wrap(model: nn.Module, env: DistEnv, strategy: str) -> nn.Module:
    """DDP, or FSDP2 (fully_shard per transformer block, then the root) for models that do not fit one device."""
    if not env.distributed:
        return model
    if strategy == "fsdp":
        from torch.distributed.fsdp import fully_shard

        for block in model.blocks:
            fully_shard(block)
        return fully_shard(model)
    from torch.nn.parallel import DistributedDataParallel

    return DistributedDataParallel(model, device_ids=[env.device.index] if env.device.type == "cuda" else None)


def all_reduce_sum(values: torch.Tensor, env: DistEnv) -> torch.Tensor:
    if env.distributed:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def gather_objects(value, env: DistEnv) -> list:
    """Every rank's value, in rank order, on every rank (a collective under torchrun)."""
    if not env.distributed:
        return [value]
    values = [None] * env.world
    dist.all_gather_object(values, value)
    return values


def is_collective_failure(error: BaseException) -> bool:
    """Whether an error comes from a collective whose peer died or hung (backend error or timeout)."""
    text = str(error).lower()
    return isinstance(error, dist.DistError) or any(s in text for s in ("timed out", "timeout", "connection closed",
                                                                        "connection reset", "broken pipe"))


def barrier(env: DistEnv) -> None:
    if env.distributed:
        dist.barrier()


def shutdown(env: DistEnv) -> None:
    if env.distributed and dist.is_initialized():
        dist.destroy_process_group()
