"""``torchrec.distributed.comm_ops`` at rectrain's path: the gradient-division switch.

Gradient division (on by default, as in TorchRec) makes the backward of every sharded collection's
collectives divide by the world size, so the tables are trained on the gradient of the mean of the ranks'
losses, as DDP trains the dense part. ``set_gradient_division(False)`` trains them on the gradient of the
sum instead (with an SGD fused optimizer: a learning rate world-size times larger). Set it before training,
the same on every rank.
"""

from rectrain.distributed.comm.autograd import get_gradient_division, set_gradient_division

__all__ = ["get_gradient_division", "set_gradient_division"]
