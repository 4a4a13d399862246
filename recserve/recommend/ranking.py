"""The ranking stage: every request's candidates scored by the ranking package in one merged batch.

A request's user features are the same for each of its N candidates, so they are looked up once per
request, not N times: one lookup batch holds a row per user (the user's bags, empty item bags) and a row per
candidate (its item bags, empty user bags), and runs in one call of the package's quantized lookups. Each
candidate's pooled row then takes its user's pooled columns (a row gather), and the package's dense part
(its traced graph, the same one ``Predictor.predict`` runs after its lookups) scores the candidates. The
scores are the package's own: a candidate's pooled columns hold the sums of the same rows in the same order
as a lookup of the joined features, and its dense row is the same.

A package served without a traced graph (``compile_dense``, or a model the tracer cannot take) is scored
through ``Predictor.predict`` on the joined features, the user's bags repeated per candidate.
"""

from __future__ import annotations

import torch
from torch import Tensor

from recserve.recommend.towers import Bags, bags_to_kjt, jagged_gather, repeat_bags
from recserve.runtime.predictor import Predictor


def _user_spans(predictor: Predictor, user_features: list[str]) -> list[tuple[int, int]]:
    """The pooled output's column spans that hold user features (its order: tables, then their features)."""
    spans, start = [], 0
    for table in predictor.lookups.embedding_bag_configs():
        for feature in table.feature_names:
            if feature in user_features:
                spans.append((start, start + table.embedding_dim))
            start += table.embedding_dim
    return spans


class Ranker:
    """``scores(user_bags, user_dense, counts, item_bags, item_dense) -> [sum(counts)]`` float32.

    ``user_bags``/``user_dense`` hold one row per request, ``counts[i]`` its candidates; ``item_bags`` and
    ``item_dense`` one row per candidate, request after request."""

    def __init__(self, predictor: Predictor, user_features: list[str], item_features: list[str]) -> None:
        self.predictor = predictor
        self.user_features, self.item_features = list(user_features), list(item_features)
        self._order = predictor.lookups.feature_order  # the kernel's order: the KJT feeds it as it is
        self._user_spans = _user_spans(predictor, self.user_features)

    @torch.inference_mode()
    def scores(
        self, user_bags: Bags, user_dense: Tensor, counts: Tensor, item_bags: Bags, item_dense: Tensor
    ) -> Tensor:
        total = int(item_dense.shape[0])
        dense = torch.cat([torch.repeat_interleave(user_dense, counts, dim=0), item_dense], dim=1)
        graph = self.predictor.graph
        if graph is None:
            bags = {f: repeat_bags(*user_bags[f], counts) for f in self.user_features}
            kjt = bags_to_kjt(self.predictor.metadata.feature_names, {**bags, **item_bags}, total)
            return self.predictor.predict(dense, kjt, checked=True)
        users = int(counts.numel())
        # Rows [0, users): the users' bags; rows [users, users + total): the candidates' bags. Every id was
        # checked (the users' by the request checks, the items' when the package was loaded).
        no_users = torch.zeros(users, dtype=torch.int64)
        no_items = torch.zeros(total, dtype=torch.int64)
        bags = {}
        for f in self.user_features:
            lengths, values = user_bags[f]
            bags[f] = (torch.cat([lengths, no_items]), values)
        for f in self.item_features:
            lengths, values = item_bags[f]
            bags[f] = (torch.cat([no_users, lengths]), values)
        kjt = bags_to_kjt(self._order, bags, users + total)
        pooled = self.predictor.lookups(kjt).values()
        candidates = pooled[users:]
        owner = torch.repeat_interleave(torch.arange(users), counts)
        for start, end in self._user_spans:
            candidates[:, start:end] = pooled[:users, start:end].index_select(0, owner)
        logits = graph.after_lookups(dense.to(self.predictor.dtype), candidates)
        return torch.sigmoid(logits.reshape(total).float())


def item_bags(
    features: dict[str, tuple[Tensor, Tensor]], rows: Tensor, widths: dict[str, int] | None = None
) -> Bags:
    """The catalogue's item features (``{feature: (offsets, values)}``) of the positions ``rows``.

    A feature whose every bag holds ``widths[f]`` ids is gathered as rows of a ``[M, width]`` view (the same
    ids in the same order as the jagged gather, without its offsets arithmetic: a third of the ranking
    stage's work besides the model, measured at 1,000 candidates)."""
    out = {}
    for f, (offsets, values) in features.items():
        width = (widths or {}).get(f)
        if width:
            ids = values.view(-1, width).index_select(0, rows).reshape(-1)
            out[f] = (torch.full((rows.numel(),), width, dtype=torch.int64), ids)
        else:
            out[f] = jagged_gather(offsets, values, rows)
    return out
