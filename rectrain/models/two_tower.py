"""Two-tower retrieval (TorchRec's ``examples/retrieval/modules/two_tower.py``): query and candidate towers.

    kjt ── ebc ──► pooled query features ──── query_proj (MLP) ────► q [B, L] ─┐
               └─► pooled candidate features ─ candidate_proj (MLP) ─► c [B, L] ─┴─ score = <q, c>

``TwoTowerTrainTask`` trains it with an in-batch softmax: each positive (query, candidate) pair of the batch
is a class, the other positives' candidates are its negatives. ``evaluate_recall_at_k`` measures how often a
query's own candidate ranks in the top K of the batch's candidates.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor, nn
from torch.nn import functional

from rectrain.embedding import EmbeddingBagCollection
from rectrain.embedding.layout import get_embedding_names_by_table
from rectrain.errors import ConfigError
from rectrain.metrics import recall_at_k, retrieval_scores
from rectrain.models.batch import Batch
from rectrain.models.mlp import MLP, check_layer_sizes
from rectrain.sparse import KeyedJaggedTensor


class TwoTower(nn.Module):
    """Query and candidate towers over one EmbeddingBagCollection (``torchrec``'s ``TwoTower``).

    Args:
        embedding_bag_collection: the tables of both towers.
        layer_sizes: sizes of each tower: ReLU layers, then a plain Linear to ``layer_sizes[-1]``; both towers
            end in ``layer_sizes[-1]`` so that their outputs can be dotted.
        device: where the towers live (default cpu).
        query_features, candidate_features: embedding names (EBC output keys) feeding each tower,
            concatenated in the order given. Default, as in TorchRec: the first table's features for the
            query tower and the second table's for the candidate tower (then exactly 2 tables are needed).

    ``forward(kjt) -> (query_embedding [B, L], candidate_embedding [B, L])``. Submodule names are TorchRec's:
    ``ebc``, ``query_proj``, ``candidate_proj``. Unlike TorchRec: a tower's last layer has no ReLU (TorchRec's
    ReLU there makes the embeddings non-negative and, at small initial scales, often all zero, so that no
    gradient flows), and a tower reading several features sizes its input to their summed dims.
    """

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        layer_sizes: list[int],
        device: torch.device | str | None = None,
        *,
        query_features: Sequence[str] | None = None,
        candidate_features: Sequence[str] | None = None,
    ) -> None:
        super().__init__()
        sizes = check_layer_sizes("layer_sizes", layer_sizes)
        configs = embedding_bag_collection.embedding_bag_configs()
        names_by_table = get_embedding_names_by_table(configs)
        dims = {name: t.embedding_dim for t, names in zip(configs, names_by_table) for name in names}
        if query_features is None and candidate_features is None:
            if len(configs) != 2:
                raise ConfigError(
                    f"TwoTower: without query_features / candidate_features the collection needs exactly 2 "
                    f"tables (query, candidate), got {len(configs)}"
                )
            query_features, candidate_features = names_by_table
        self._query_features = _check_features("query_features", query_features, dims)
        self._candidate_features = _check_features("candidate_features", candidate_features, dims)
        shared = sorted(set(self._query_features) & set(self._candidate_features))
        if shared:
            raise ConfigError(f"TwoTower: query_features and candidate_features share {shared}")
        self.ebc = embedding_bag_collection
        query_in = sum(dims[f] for f in self._query_features)
        candidate_in = sum(dims[f] for f in self._candidate_features)
        self.query_proj = _tower(query_in, sizes, device)
        self.candidate_proj = _tower(candidate_in, sizes, device)

    @property
    def query_features(self) -> list[str]:
        return list(self._query_features)

    @property
    def candidate_features(self) -> list[str]:
        return list(self._candidate_features)

    def forward(self, kjt: KeyedJaggedTensor) -> tuple[Tensor, Tensor]:
        pooled = self.ebc(kjt).to_dict()
        query = torch.cat([pooled[f] for f in self._query_features], dim=1)
        candidate = torch.cat([pooled[f] for f in self._candidate_features], dim=1)
        return self.query_proj(query), self.candidate_proj(candidate)


def _tower(in_features: int, sizes: list[int], device: torch.device | str | None) -> nn.Sequential:
    """ReLU layers ``sizes[:-1]``, then a Linear to ``sizes[-1]`` (the embedding; may be negative)."""
    last_in = sizes[-2] if len(sizes) > 1 else in_features
    return nn.Sequential(
        MLP(in_features, sizes[:-1], device=device), nn.Linear(last_in, sizes[-1], device=device)
    )


def _check_features(name: str, features: Sequence[str] | None, dims: dict[str, int]) -> list[str]:
    features = list(features or [])
    if not features:
        raise ConfigError(f"TwoTower: {name} must name at least one feature; features are {sorted(dims)}")
    for position, feature in enumerate(features):
        if feature not in dims:
            raise ConfigError(
                f"TwoTower: {name}[{position}] {feature!r} is not a feature of the collection; "
                f"features are {sorted(dims)}"
            )
    return features


def candidate_items(two_tower: TwoTower, kjt: KeyedJaggedTensor) -> Tensor:
    """One int id per example naming its candidate item: examples with equal candidate features (ids, in
    order, of every candidate feature) get equal ids. Recall@K ranks among distinct items with it."""
    columns = []
    for feature in two_tower.candidate_features:
        jagged = kjt[feature]
        columns += [jagged.lengths().to(torch.int64)[:, None], jagged.to_padded_dense().to(torch.int64)]
    keys = torch.cat(columns, dim=1)
    if keys.shape[0] == 0:
        return torch.zeros(0, dtype=torch.int64, device=keys.device)
    return torch.unique(keys, dim=0, return_inverse=True)[1]


def positive_mask(labels: Tensor) -> Tensor:
    """Which examples are positive pairs: ``label > 0`` when labels are binary (all 0/1), else all of them."""
    labels = labels.reshape(-1)
    binary = bool(((labels == 0) | (labels == 1)).all())
    return labels > 0 if binary else torch.ones_like(labels, dtype=torch.bool)


def in_batch_softmax_loss(query: Tensor, candidate: Tensor, temperature: float = 1.0) -> Tensor:
    """Cross entropy of ``softmax(Q C^T / temperature)`` rows against the diagonal (row i's positive is i).

    ``query`` and ``candidate`` are the positive pairs ``[P, L]``. With no pairs the loss is 0 (kept attached
    to both inputs so that backward still reaches every parameter, as DDP requires).
    """
    if query.shape[0] == 0:
        return (query.sum() + candidate.sum()) * 0.0
    logits = retrieval_scores(query, candidate) / temperature
    target = torch.arange(query.shape[0], device=query.device)
    return functional.cross_entropy(logits, target)


class TwoTowerPrediction(nn.Module):
    """The serving form of a ``TwoTower``: ``forward(dense, kjt) -> <q, c>`` logits ``[B]``.

    ``dense`` is accepted for the common prediction signature and not read. State-dict keys are
    ``model.`` + TwoTower's (``model.ebc.embedding_bags.<table>.weight``, ``model.query_proj...``).
    """

    def __init__(self, two_tower: TwoTower) -> None:
        super().__init__()
        self.model = two_tower

    def forward(self, dense_features: Tensor, sparse_features: KeyedJaggedTensor) -> Tensor:
        query, candidate = self.model(sparse_features)
        return (query * candidate).sum(dim=1)


class TwoTowerTrainTask(nn.Module):
    """In-batch softmax training of a ``TwoTower`` (TorchRec's ``TwoTowerTrainTask``, with a softmax loss).

    ``forward(batch) -> (loss, (loss.detach(), logits.detach(), labels.detach()))``: the loss is
    ``in_batch_softmax_loss`` over the batch's positive pairs (``positive_mask``); ``logits [B]`` are every
    example's ``<q, c>`` (what the prediction module serves), for AUC-style metrics on the labels. Other
    positives that share a candidate id count as negatives (the usual in-batch approximation).

    ``.prediction_model`` is the ``TwoTowerPrediction`` child ``model``; ``.two_tower`` the towers.
    """

    def __init__(self, two_tower: TwoTower, temperature: float = 1.0) -> None:
        super().__init__()
        if not temperature > 0:
            raise ConfigError(f"TwoTowerTrainTask: temperature must be > 0, got {temperature}")
        self.model = TwoTowerPrediction(two_tower)
        self.temperature = temperature

    @property
    def prediction_model(self) -> TwoTowerPrediction:
        return self.model

    @property
    def two_tower(self) -> TwoTower:
        return self.model.model

    def forward(self, batch: Batch) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
        query, candidate = self.two_tower(batch.sparse_features)
        keep = positive_mask(batch.labels)
        loss = in_batch_softmax_loss(query[keep], candidate[keep], self.temperature)
        logits = (query * candidate).sum(dim=1)
        return loss, (loss.detach(), logits.detach(), batch.labels.detach())


@torch.no_grad()
def evaluate_recall_at_k(model: nn.Module, batches: Iterable[Batch], k: int) -> float:
    """Recall@K over ``batches``: per positive pair, is its item in the top K of the batch's candidate items.

    ``model`` is a ``TwoTower`` or a module holding one (``TwoTowerTrainTask``, ``TwoTowerPrediction``, or
    either under ``DistributedModelParallel``'s ``.module``). The candidates of a batch are its positive
    pairs' distinct items (``candidate_items``), so chance level is about ``k / distinct items per batch``;
    another item tied with the positive counts against the query (``recall_at_k``), so constant towers get
    no credit, while copies of the query's own item do not. Returns the mean over all positive pairs seen
    (0.0 if there were none).
    """
    two_tower = _find_two_tower(model)
    hits, total = 0.0, 0
    for batch in batches:
        query, candidate = two_tower(batch.sparse_features)
        keep = positive_mask(batch.labels)
        query, candidate = query[keep], candidate[keep]
        if query.shape[0] == 0:
            continue
        positives = torch.arange(query.shape[0], device=query.device)
        scores = retrieval_scores(query, candidate)
        items = candidate_items(two_tower, batch.sparse_features)[keep]
        hits += recall_at_k(scores, positives, k, items) * query.shape[0]
        total += query.shape[0]
    return hits / total if total else 0.0


def _find_two_tower(model: nn.Module) -> TwoTower:
    if isinstance(model, TwoTower):
        return model
    for module in model.modules():
        if isinstance(module, TwoTower):
            return module
    raise ConfigError(f"evaluate_recall_at_k: {type(model).__name__} contains no TwoTower")
