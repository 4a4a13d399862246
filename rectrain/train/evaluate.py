"""One evaluation pass over held-out batches: AUC, NE, log loss, accuracy, calibration (and recall@K).

Scores are ``sigmoid(prediction_model(dense, kjt))``; the metrics are ``RecMetric``s (``MetricsComputer``,
so the metrics log's AUC and NE are ``RecMetricModule``'s on the same scores). A two-tower model is also
scored for retrieval: recall@K of each positive pair's item among the batch's distinct positive candidate
items (as ``rectrain.models.two_tower.evaluate_recall_at_k``), summed over every rank's batches. Every rank
must call ``evaluate`` at the same step (metrics and sharded lookups are collectives); the rank with the
fewest held-out batches ends the pass for all.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch
import torch.distributed as dist
from torch import Tensor, nn

from rectrain.distributed.comm.timeouts import collective
from rectrain.metrics import MetricsComputer
from rectrain.metrics.functional import recall_hits, retrieval_scores
from rectrain.models.batch import Batch
from rectrain.models.two_tower import TwoTower, candidate_items, positive_mask
from rectrain.train.sync import AgreedBatches, RankAgreement


class _RecallAtK:
    """Running recall@K hits and positive pairs of a two-tower model, summed across ranks on compute."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.sums = torch.zeros(2, dtype=torch.float64)  # hits, pairs

    def update(self, query: Tensor, candidate: Tensor, items: Tensor, labels: Tensor) -> None:
        keep = positive_mask(labels)
        query, candidate, items = query[keep], candidate[keep], items[keep]
        if query.shape[0] == 0:
            return
        positives = torch.arange(query.shape[0], device=query.device)
        hits = recall_hits(retrieval_scores(query, candidate), positives, self.k, items).sum().cpu()
        self.sums += torch.tensor([float(hits), float(query.shape[0])], dtype=torch.float64)

    def compute(self) -> float:
        sums = self.sums.clone()
        if dist.is_available() and dist.is_initialized():
            with collective("all_reduce (recall@k)"):
                dist.all_reduce(sums)
        hits, pairs = sums.tolist()
        return hits / pairs if pairs else float("nan")


def _two_tower_of(model: nn.Module) -> TwoTower | None:
    return next((m for m in model.modules() if isinstance(m, TwoTower)), None)


@torch.no_grad()
def evaluate(
    prediction_model: nn.Module,
    batches: Iterator[Batch],
    device: torch.device,
    agreement: RankAgreement,
    recall_k: int = 10,
) -> dict[str, float]:
    """Metrics of ``prediction_model`` on ``batches`` (this rank's share), aggregated over all ranks."""
    was_training = prediction_model.training
    prediction_model.eval()
    computer = MetricsComputer()
    two_tower = _two_tower_of(prediction_model)
    recall = _RecallAtK(recall_k) if two_tower is not None else None
    try:
        for batch in AgreedBatches(batches, agreement):
            batch = batch.to(device)
            if two_tower is not None:
                query, candidate = two_tower(batch.sparse_features)
                logits = (query * candidate).sum(dim=1)
                items = candidate_items(two_tower, batch.sparse_features)
                recall.update(query, candidate, items, batch.labels)
            else:
                logits = prediction_model(batch.dense_features, batch.sparse_features).reshape(-1)
            computer.update(torch.sigmoid(logits.float()), batch.labels.reshape(-1))
    finally:
        prediction_model.train(was_training)
    metrics = computer.compute()
    if recall is not None:
        metrics[f"recall@{recall_k}"] = recall.compute()
    return metrics
