"""``MetricsComputer``: accumulate predictions and labels over batches, compute metrics across ranks.

Memory: log loss, NE, accuracy and calibration come from five running sums (exact over everything seen,
O(1) memory). AUC needs the examples themselves: by default all of them are kept (8 bytes per example,
exact AUC over the epoch); with ``auc_window=N`` each rank keeps only its latest N examples and AUC is over
the union of the ranks' windows (TorchRec's windowed AUC).

``compute(pg)`` is a collective when ``torch.distributed`` is initialised: every rank of ``pg`` (default: the
world) must call it. Sums are all-reduced and the AUC examples all-gathered, so AUC is computed on the union
of every rank's examples, never averaged. Every rank gets the same result.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import Tensor

from rectrain.metrics import functional as F

_SUM_NAMES = ("count", "label_sum", "prediction_sum", "loss_sum", "correct")


class MetricsComputer:
    """Binary-classification metrics over a stream of batches: auc, ne, log_loss, accuracy, calibration."""

    def __init__(self, auc_window: int | None = None, threshold: float = 0.5) -> None:
        if auc_window is not None and auc_window < 1:
            raise ValueError(f"auc_window must be None (keep all) or >= 1, got {auc_window}")
        self.auc_window = auc_window
        self.threshold = threshold
        self.reset()

    def reset(self) -> None:
        """Forget everything seen so far (e.g. at the start of an evaluation pass)."""
        self._sums = torch.zeros(len(_SUM_NAMES), dtype=torch.float64)
        self._chunks: list[Tensor] = []
        self._stored = 0

    @torch.no_grad()
    def update(self, predictions: Tensor, labels: Tensor) -> None:
        """Add a batch: ``predictions`` are probabilities in [0, 1], ``labels`` 0/1, same shape."""
        if predictions.shape != labels.shape:
            raise ValueError(
                f"predictions {tuple(predictions.shape)} and labels {tuple(labels.shape)} differ"
            )
        p = predictions.detach().reshape(-1).to("cpu", torch.float64)
        y = labels.detach().reshape(-1).to("cpu", torch.float64)
        correct = ((p >= self.threshold).to(torch.float64) == y).sum()
        self._sums += torch.stack([torch.tensor(p.numel()), y.sum(), p.sum(), F.log_loss_sum(p, y), correct])
        self._chunks.append(torch.stack([p, y], dim=1).to(torch.float32))
        self._stored += p.numel()
        if self.auc_window is not None and self._stored >= 2 * self.auc_window:
            self._chunks = [self._window()]
            self._stored = self._chunks[0].shape[0]

    def _window(self) -> Tensor:
        examples = torch.cat(self._chunks) if self._chunks else torch.zeros(0, 2)
        return examples if self.auc_window is None else examples[-self.auc_window :]

    @torch.no_grad()
    def compute(self, pg: dist.ProcessGroup | None = None) -> dict[str, float]:
        """Metrics over all ranks of ``pg`` when distributed is initialised, else over this process."""
        sums, examples = self._sums.clone(), self._window()
        if dist.is_available() and dist.is_initialized():
            sums, examples = _aggregate(sums, examples, pg)
        elif pg is not None:
            raise ValueError(
                "compute(pg=...) was given a process group but torch.distributed is not initialised"
            )
        count, label_sum, prediction_sum, loss_sum, correct = sums.tolist()
        nan = math.nan
        return {
            "auc": F.auc(examples[:, 0], examples[:, 1]),
            "ne": F.ne_from_sums(loss_sum, label_sum, int(count)),
            "log_loss": loss_sum / count if count else nan,
            "accuracy": correct / count if count else nan,
            "calibration": prediction_sum / label_sum if label_sum > 0 else nan,
            "num_examples": count,
        }


def _aggregate(sums: Tensor, examples: Tensor, pg: dist.ProcessGroup | None) -> tuple[Tensor, Tensor]:
    """All-reduce the running sums and all-gather the AUC examples (rank order) over ``pg``."""
    from rectrain.distributed.comm.autograd import comm_device
    from rectrain.distributed.comm.ops import all_gather_v
    from rectrain.distributed.comm.timeouts import collective

    device = comm_device(pg)
    sums = sums.to(device)
    with collective("all_reduce (metrics)", pg):
        dist.all_reduce(sums, group=pg)
    gathered = all_gather_v(examples.to(device), group=pg)
    return sums.cpu(), gathered.cpu()
