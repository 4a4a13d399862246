"""``torchrec.distributed.comm_ops`` at rectrain's path: the gradient-division switch, and TorchRec's name
for the engine's even all-gather (``all_gather_base_pooled``: ``comm.ops.all_gather_v`` with equal sizes).

Gradient division (on by default, as in TorchRec) makes the backward of every sharded collection's
collectives divide by the world size, so the tables are trained on the gradient of the mean of the ranks'
losses, as DDP trains the dense part. ``set_gradient_division(False)`` trains them on the gradient of the
sum instead (with an SGD fused optimizer: a learning rate world-size times larger). Set it before training,
the same on every rank.
"""

from typing import Any

import torch.distributed as dist
from torch import Tensor

from rectrain.distributed.comm.autograd import get_gradient_division, set_gradient_division
from rectrain.distributed.comm.ops import all_gather_v
from rectrain.distributed.comm.pending import Pending
from rectrain.errors import ConfigError


def all_gather_base_pooled(
    input: Tensor, group: dist.ProcessGroup | None = None, codecs: Any = None
) -> Pending[Tensor]:
    """Every rank's equally sized ``input`` concatenated along dim 0, in rank order (awaitable; backward is
    the reduce-scatter)."""
    if codecs is not None:
        raise ConfigError("all_gather_base_pooled(codecs=...): rectrain's collectives are not quantized")
    sizes = [input.shape[0]] * dist.get_world_size(group)
    return all_gather_v(input, sizes, group, async_op=True)


__all__ = ["all_gather_base_pooled", "get_gradient_division", "set_gradient_division"]
