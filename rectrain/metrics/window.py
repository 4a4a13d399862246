"""``WindowedMetrics``: AUC and NE over the latest examples of every rank (progressive validation).

Each rank keeps its latest ``window`` (prediction, label) pairs on the device they were made on: ``update``
only appends and trims (no host sync, so it can run every training step on a GPU). ``compute`` is a
collective: the ranks' windows are all-gathered and AUC and NE are computed on their union with the same
formulas as ``MetricsComputer`` (``functional.auc``, ``functional.ne_from_sums``). With ``W`` ranks each
keeping ``window / W`` examples, the union is the job's latest ``window`` examples.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from rectrain.metrics import functional as F


class WindowedMetrics:
    """AUC and NE over each rank's latest ``window`` examples, combined across ranks on ``compute``."""

    def __init__(self, window: int) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1, got {window}")
        self.window = window
        self._chunks: list[Tensor] = []  # [n, 2] (prediction, label), oldest first
        self._stored = 0

    @torch.no_grad()
    def update(self, predictions: Tensor, labels: Tensor) -> None:
        """Add a batch: ``predictions`` are probabilities in [0, 1], ``labels`` 0/1, same shape."""
        if predictions.shape != labels.shape:
            raise ValueError(
                f"predictions {tuple(predictions.shape)} and labels {tuple(labels.shape)} differ"
            )
        pair = torch.stack([predictions.detach().reshape(-1), labels.detach().reshape(-1)], dim=1)
        self._chunks.append(pair.to(torch.float32))
        self._stored += pair.shape[0]
        while self._chunks and self._stored - self._chunks[0].shape[0] >= self.window:
            self._stored -= self._chunks.pop(0).shape[0]  # whole chunks older than the window

    def examples(self) -> Tensor:
        """This rank's window, ``[n, 2]`` on the CPU, n <= ``window``."""
        if not self._chunks:
            return torch.zeros(0, 2)
        return torch.cat(self._chunks)[-self.window :].cpu()

    @torch.no_grad()
    def compute(self, pg: dist.ProcessGroup | None = None) -> dict[str, float]:
        """``auc``, ``ne``, ``log_loss`` and ``num_examples`` over every rank's window (collective when
        ``torch.distributed`` is initialised)."""
        examples = self.examples()
        if dist.is_available() and dist.is_initialized() and dist.get_world_size(pg) > 1:
            examples = _gathered(examples, pg)
        p, y = examples[:, 0].to(torch.float64), examples[:, 1].to(torch.float64)
        count = p.numel()
        loss_sum = float(F.log_loss_sum(p, y))
        return {
            "auc": F.auc(p, y),
            "ne": F.ne_from_sums(loss_sum, float(y.sum()), count),
            "log_loss": loss_sum / count if count else float("nan"),
            "num_examples": count,
        }


def _gathered(examples: Tensor, pg: dist.ProcessGroup | None) -> Tensor:
    from rectrain.distributed.comm.autograd import comm_device
    from rectrain.distributed.comm.ops import all_gather_v

    gathered = all_gather_v(examples.to(comm_device(pg)), group=pg)
    return gathered.cpu()
