"""``torchrec.optim.apply_optimizer_in_backward`` at rectrain's path: torch's, which TorchRec's wraps too."""

from torch.distributed.optim import _apply_optimizer_in_backward as apply_optimizer_in_backward

__all__ = ["apply_optimizer_in_backward"]
