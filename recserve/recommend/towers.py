"""The two towers of a loaded two-tower package, run one at a time, and jagged feature helpers.

A ``Predictor`` of a two-tower package scores ``<query, candidate>``; retrieval needs each tower alone: the
query tower for requests, the candidate tower for the catalogue at export. Both read the package's quantized
lookups (so the embeddings at export and at serving come from the same weights); the other tower's features
are sent as empty bags. Bags are ``{feature: (lengths [B] int64, values int64)}``.
"""

from __future__ import annotations

import torch
from torch import Tensor

from recserve.runtime.predictor import Predictor
from recserve.runtime.validation import RequestValidator
from rectrain.sparse import KeyedJaggedTensor

Bags = dict[str, tuple[Tensor, Tensor]]


def bags_to_kjt(keys: list[str], bags: Bags, batch: int) -> KeyedJaggedTensor:
    """A KJT over ``keys`` (key-major); a key missing from ``bags`` has an empty bag per example."""
    empty = (torch.zeros(batch, dtype=torch.int64), torch.zeros(0, dtype=torch.int64))
    parts = [bags.get(k, empty) for k in keys]
    return KeyedJaggedTensor(
        keys=list(keys),
        values=torch.cat([v for _, v in parts]) if parts else torch.zeros(0, dtype=torch.int64),
        lengths=torch.cat([length for length, _ in parts]) if parts else torch.zeros(0, dtype=torch.int64),
        stride=batch,
    )


def kjt_to_bags(kjt: KeyedJaggedTensor) -> Bags:
    return {k: (j.lengths().to(torch.int64), j.values().to(torch.int64)) for k, j in kjt.to_dict().items()}


def jagged_gather(offsets: Tensor, values: Tensor, rows: Tensor) -> tuple[Tensor, Tensor]:
    """``(lengths, values)`` of the bags ``rows`` of a jagged feature given by ``offsets [R+1]``."""
    starts = offsets[rows]
    lengths = offsets[rows + 1] - starts
    total = int(lengths.sum())
    if total == 0:
        return lengths, values[:0]
    out_starts = torch.cumsum(lengths, 0) - lengths
    index = torch.repeat_interleave(starts - out_starts, lengths) + torch.arange(total)
    return lengths, values[index]


def repeat_bags(lengths: Tensor, values: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
    """Each example's bag repeated ``counts[i]`` times (the user's features beside each candidate)."""
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64)
    torch.cumsum(lengths, 0, out=offsets[1:])
    rows = torch.repeat_interleave(torch.arange(lengths.numel()), counts)
    return jagged_gather(offsets, values, rows)


class Towers:
    """``embed("query" | "candidate", bags, batch) -> [B, L]`` float32 from a two-tower ``Predictor``."""

    def __init__(self, predictor: Predictor) -> None:
        self.predictor = predictor
        self.two_tower = predictor.model.model
        self.features = list(predictor.metadata.feature_names)
        self._validator = RequestValidator(0, predictor.metadata.num_embeddings)

    @torch.inference_mode()
    def embed(self, side: str, bags: Bags, batch: int) -> Tensor:
        tower = self.two_tower
        names = tower.query_features if side == "query" else tower.candidate_features
        kjt = bags_to_kjt(self.features, {f: bags[f] for f in names}, batch)
        # The kernels do not bounds-check ids: the validator's memory-safety checks always run.
        _, kjt = self._validator.safe_batch(torch.zeros(batch, 0), kjt, checked=True)
        pooled = tower.ebc(kjt).to_dict()
        proj = tower.query_proj if side == "query" else tower.candidate_proj
        return proj(torch.cat([pooled[f] for f in names], dim=1)).float()
