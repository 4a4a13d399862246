"""One CPU embedding backward for every rank of a run: rank 0's choice, agreed before any table is sharded.

Each rank's ``auto`` could differ (``RECTRAIN_CPU_BACKWARD`` set on one host only, numba failing on one) and
the two kernels sum a row's gradients in different orders, so a run mixing them would not be reproducible.
Every rank sends what ``auto`` means to it; all take rank 0's kernel, except that the compiled kernel is
only agreed when every rank can run it (a rank without it would run the slower torch-ops form instead).
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from rectrain.distributed.comm.env import ShardingEnv
from rectrain.distributed.comm.timeouts import collective
from rectrain.embedding.backward_choice import BackwardChoice, auto_choice
from rectrain.embedding.cpu_backward_runner import compiled_ready

logger = logging.getLogger(__name__)


def agree_on_auto(env: ShardingEnv, device: torch.device) -> BackwardChoice | None:
    """What ``cpu_backward="auto"`` means on every rank of ``env`` (collective); None off the CPU."""
    if device.type != "cpu":
        return None
    local = (auto_choice(), compiled_ready())
    if env.pg is None or env.world_size == 1:
        return local[0]
    gathered: list = [None] * env.world_size
    with collective("all_gather_object (CPU embedding backward)", env.pg):
        dist.all_gather_object(gathered, local, group=env.pg)
    first: BackwardChoice = gathered[0][0]
    lacking = [rank for rank, (_, ready) in enumerate(gathered) if not ready]
    if first.kernel == "native" and lacking:
        reason = f"rank 0 chose native, but ranks {lacking} cannot run the compiled kernel"
        choice = BackwardChoice("fbgemm", reason)
    else:
        choice = BackwardChoice(first.kernel, f"rank 0's choice: {first.reason}")
    if env.rank == 0:
        logger.info(
            "CPU fused embedding backward on all %d ranks: %s (%s)",
            env.world_size,
            choice.kernel,
            choice.reason,
        )
    return choice
