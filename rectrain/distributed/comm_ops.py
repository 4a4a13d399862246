"""``torchrec.distributed.comm_ops`` at rectrain's path: the gradient-division switch.

``set_gradient_division(True)`` makes the backward of every sharded collection's collectives divide by the
world size, so the tables are trained on the gradient of the mean of the ranks' losses (what DDP gives the
dense part); that is TorchRec's default. rectrain's default is off (the gradient of the sum; with an SGD
fused optimizer, a learning rate world-size times TorchRec's). Set it before training, the same on every
rank.
"""

from rectrain.distributed.comm_autograd import get_gradient_division, set_gradient_division

__all__ = ["get_gradient_division", "set_gradient_division"]
