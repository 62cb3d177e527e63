"""The process group of a `torchrun` launch: who this process is, the backend, collectives with a timeout.

torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT for every worker; without
them (a plain `tfm train`) everything here is the single-process identity and no group is created.
Library code: it never prints.
"""

from __future__ import annotations

import datetime
import os
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from tfm_cli.errors import TfmError

# A test-only fault hook: with TFM_TEST_FAIL_AT="RANK:STEP" in the environment, rank RANK raises before
# update STEP. The distributed tests use it to check that a dead rank stops the run instead of hanging.
FAIL_AT_ENV = "TFM_TEST_FAIL_AT"
# Another: TFM_TEST_PREPARE_DELAY=SECONDS makes rank 0 take that much longer to prepare the data, to show
# that the other ranks' wait for it is not bounded by train.dist_timeout.
PREPARE_DELAY_ENV = "TFM_TEST_PREPARE_DELAY"
# How long the other ranks wait for rank 0 to prepare the data (a week): preparing a large corpus
# may take hours, far longer than train.dist_timeout allows any training collective.
PREPARE_TIMEOUT_S = 7 * 24 * 3600


@dataclass(frozen=True)
class World:
    """This process's place in the run: rank 0 of 1 when not launched by torchrun."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        """True when there are other ranks to talk to."""
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 writes checkpoints, logs and metrics, and validates."""
        return self.rank == 0


def world_from_env() -> World:
    """The World described by torchrun's environment variables (rank 0 of 1 if they are absent)."""
    try:
        rank = int(os.environ.get("RANK", "0"))
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:
        raise TfmError("RANK, WORLD_SIZE and LOCAL_RANK must be integers (they are set by torchrun)") from None
    if world_size < 1 or not 0 <= rank < world_size:
        raise TfmError(f"RANK={rank} WORLD_SIZE={world_size}: not a valid torchrun environment")
    return World(rank, world_size, local_rank)


def rank_device(world: World, device: torch.device) -> torch.device:
    """The device of this rank: cuda:LOCAL_RANK for a CUDA run launched by torchrun, else `device`."""
    if world.distributed and device.type == "cuda":
        return torch.device("cuda", world.local_rank)
    return device


def init_process_group(world: World, device: torch.device, timeout_s: float) -> None:
    """Join the process group (NCCL on CUDA, gloo on CPU); collectives waiting longer than timeout_s fail.

    A no-op for a single process. A rank that dies makes the others' next collective fail (and torchrun
    stops the remaining workers); a rank that hangs makes them fail after timeout_s.
    """
    if not world.distributed:
        return
    if device.type == "cuda":
        torch.cuda.set_device(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, rank=world.rank, world_size=world.world_size, timeout=datetime.timedelta(seconds=timeout_s),
        device_id=device if device.type == "cuda" else None,
    )


def destroy_process_group(world: World) -> None:
    """Leave the process group, if one was joined."""
    if world.distributed and dist.is_initialized():
        dist.destroy_process_group()


def barrier(world: World) -> None:
    """Wait until every rank gets here (e.g. while rank 0 validates or writes files)."""
    if world.distributed:
        dist.barrier()


def all_reduce_sum(values: torch.Tensor, world: World) -> torch.Tensor:
    """`values` summed over all ranks (the same tensor, reduced in place); unchanged for one process."""
    if world.distributed:
        dist.all_reduce(values, op=dist.ReduceOp.SUM)
    return values


def all_reduce_max(values: torch.Tensor, world: World) -> torch.Tensor:
    """The element-wise maximum of `values` over all ranks (reduced in place)."""
    if world.distributed:
        dist.all_reduce(values, op=dist.ReduceOp.MAX)
    return values


def all_gather(tensor: torch.Tensor, world: World, device: torch.device) -> list[torch.Tensor]:
    """Every rank's `tensor` (same shape and dtype on all ranks), in rank order, as CPU tensors."""
    if not world.distributed:
        return [tensor]
    local = tensor.to(device)
    gathered = [torch.empty_like(local) for _ in range(world.world_size)]
    dist.all_gather(gathered, local)
    return [item.cpu() for item in gathered]


def preparation_group(world: World) -> dist.ProcessGroup | None:
    """A gloo group of all ranks whose collectives time out after PREPARE_TIMEOUT_S, for waiting on
    rank 0's data preparation (None for a single process). Every rank must call it, in the same order."""
    if not world.distributed:
        return None
    return dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=PREPARE_TIMEOUT_S))


def broadcast_text(
    text: str | None, world: World, device: torch.device, group: dist.ProcessGroup | None = None
) -> str | None:
    """Rank 0's `text` (or None) on every rank; the other ranks pass None. A collective: every rank calls it.

    Two broadcasts, the UTF-8 length (-1 for None) and then the bytes, so nothing is pickled. With a
    `group` (a gloo one, see preparation_group) the tensors stay on the CPU.
    """
    if not world.distributed:
        return text
    if group is not None:
        device = torch.device("cpu")
    data = text.encode() if text is not None else b""
    size = torch.tensor([-1 if text is None else len(data)], device=device)
    dist.broadcast(size, src=0, group=group)  # rank 0's size replaces the others'
    if size.item() < 0:
        return None
    if world.is_main:
        buffer = torch.tensor(list(data), dtype=torch.uint8, device=device)
    else:
        buffer = torch.empty(int(size.item()), dtype=torch.uint8, device=device)
    if buffer.numel():  # an empty message needs no second broadcast
        dist.broadcast(buffer, src=0, group=group)
    return bytes(buffer.cpu().tolist()).decode()


def prepare_delay_hook() -> None:
    """Sleep for TFM_TEST_PREPARE_DELAY seconds, if set (test-only; see PREPARE_DELAY_ENV)."""
    delay = os.environ.get(PREPARE_DELAY_ENV)
    if delay:
        time.sleep(float(delay))


def check_fault_hook(world: World, step: int) -> None:
    """Raise if TFM_TEST_FAIL_AT names this rank and `step` (test-only; see FAIL_AT_ENV)."""
    target = os.environ.get(FAIL_AT_ENV)
    if target and target == f"{world.rank}:{step}":
        raise RuntimeError(f"{FAIL_AT_ENV}: rank {world.rank} fails on purpose before update {step}")
