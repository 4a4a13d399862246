"""``RecommendPipeline``: a loaded pipeline package that recommends, in process and in the server.

    pipeline = RecommendPipeline.load("pipe/")             # verifies every file, maps items and index
    recs = pipeline.recommend(dense, kjt, k=10, exclude=[[3, 7]])   # per user: item_ids [k], scores [k]

A batch of checked requests runs each stage once for the whole batch: the query tower over every user, one
index search, the filter, then the ranking model over every request's candidates in one merged batch, and a
top-k per request. The server's batcher calls :meth:`RecommendPipeline.run` on its batches, so served results
are the offline pipeline's. ``exact=True`` retrieves by brute force over the embeddings (the reference that
the index's recall is measured against).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from recserve.errors import InvalidRequestError
from recserve.recommend.index import read_index, search
from recserve.recommend.items import ItemStore, map_tensors
from recserve.recommend.manifest import (
    EMBEDDINGS_FILE,
    INDEX_FILE,
    ITEMS_FILE,
    PipelineManifest,
    read_pipeline,
)
from recserve.recommend.ranking import Ranker, item_bags
from recserve.recommend.towers import Bags, Towers, jagged_gather, kjt_to_bags
from recserve.runtime.dense_bounds import DenseBounds
from recserve.runtime.predictor import Predictor
from recserve.runtime.validation import RequestValidator
from rectrain.sparse import KeyedJaggedTensor

STAGES = ("query", "retrieval", "ranking")


@dataclass
class UserRequest:
    """One user's checked request: dense ``[1, user_dense]``, bags of the user features, its bounds."""

    dense: Tensor
    bags: Bags
    k: int
    num_candidates: int
    exclude: Tensor  # int64 item ids never returned


@dataclass
class Recommendation:
    item_ids: Tensor  # [k] int64, best first
    scores: Tensor  # [k] float32: the ranking model's scores (sigmoid of its logits)
    candidates: int  # candidates ranked for this request


@dataclass
class StageTimes:
    seconds: dict[str, float] = field(default_factory=dict)
    candidates: int = 0


class RecommendPipeline:
    """Retrieval (query tower + index) -> filter -> ranking -> top-k, over one pipeline package."""

    def __init__(self, directory: Path, manifest: PipelineManifest, *, exact: bool = False) -> None:
        self.directory, self.manifest, self.exact = directory, manifest, exact
        self.plan, self.limits = manifest.plan, manifest.limits
        self.towers = Towers(Predictor.load(directory / "retrieval", verify=False))
        self.ranker = Predictor.load(directory / "ranking", verify=False)
        self.ranking = Ranker(self.ranker, self.plan.ranking_user_features, self.plan.ranking_item_features)
        self.items = ItemStore(directory / ITEMS_FILE, self.plan, int(manifest.catalogue["rows"]))
        self.embeddings = map_tensors(directory / EMBEDDINGS_FILE)["embeddings"]
        self.index = None if exact else read_index(directory / INDEX_FILE, manifest.index)
        self.validator = RequestValidator(self.plan.user_dense, self.user_num_embeddings)
        bounds = self.ranker.metadata.dense_bounds
        width = self.plan.user_dense
        self.user_bounds = (
            None if bounds is None else DenseBounds(bounds.low[:width], bounds.high[:width], bounds.clip)
        )

    @classmethod
    def load(cls, directory: str | Path, *, verify: bool = True, exact: bool = False) -> RecommendPipeline:
        """Check every file (sha256, unless ``verify=False``) and both stage packages, then load."""
        manifest = read_pipeline(directory, verify=verify)
        return cls(Path(directory), manifest, exact=exact)

    @property
    def model_name(self) -> str:
        return self.manifest.model_name

    @property
    def version(self) -> str:
        return self.manifest.version

    @property
    def user_num_embeddings(self) -> dict[str, int]:
        return {f: self.plan.num_embeddings[f] for f in self.plan.user_features}

    def check(
        self,
        dense: Tensor,
        kjt: KeyedJaggedTensor,
        *,
        k: int = 0,
        num_candidates: int = 0,
        exclude: Sequence[int] | Tensor = (),
        checked: bool = False,
    ) -> list[UserRequest]:
        """Each user of ``(dense, kjt)`` as a checked request; InvalidRequestError naming the field.

        ``k`` and ``num_candidates`` 0 take the package's defaults; ``exclude`` applies to every user."""
        limits = self.limits
        k = k or limits.top_k
        n = num_candidates or limits.num_candidates
        if not 1 <= k <= limits.max_k:
            raise InvalidRequestError(f"k: {k} is outside [1, {limits.max_k}]")
        if not 1 <= n <= limits.max_candidates:
            raise InvalidRequestError(f"num_candidates: {n} is outside [1, {limits.max_candidates}]")
        excluded = torch.as_tensor(exclude, dtype=torch.int64).reshape(-1)
        if excluded.numel() > limits.max_exclude:
            raise InvalidRequestError(
                f"exclude: {excluded.numel()} ids, at most {limits.max_exclude} are taken"
            )
        batch, safe = self.validator.safe_batch(dense, kjt, checked=checked)
        if self.user_bounds is not None:
            dense = self.user_bounds.apply(dense)
        bags = kjt_to_bags(safe)
        out = []
        for user in range(batch):
            rows = torch.tensor([user])
            one = {}
            for f, (lengths, values) in bags.items():
                offsets = torch.zeros(batch + 1, dtype=torch.int64)
                torch.cumsum(lengths, 0, out=offsets[1:])
                one[f] = jagged_gather(offsets, values, rows)
            out.append(UserRequest(dense[user : user + 1].float(), one, k, n, excluded))
        return out

    def recommend(
        self,
        dense: Tensor,
        kjt: KeyedJaggedTensor,
        *,
        k: int = 0,
        num_candidates: int = 0,
        exclude: Sequence[Sequence[int]] | None = None,
    ) -> list[Recommendation]:
        """Recommendations for every user of the batch (``exclude[i]``: user i's ids never returned)."""
        users = self.check(dense, kjt, k=k, num_candidates=num_candidates)
        for user, ids in zip(users, exclude or []):
            user.exclude = torch.as_tensor(list(ids), dtype=torch.int64)
        return self.run(users)[0]

    @torch.inference_mode()
    def run(self, users: list[UserRequest]) -> tuple[list[Recommendation], StageTimes]:
        """Every stage once for the batch of checked ``users``; per user its recommendation."""
        times = StageTimes()
        t0 = time.perf_counter()
        batch = len(users)
        merged = {
            f: (torch.cat([u.bags[f][0] for u in users]), torch.cat([u.bags[f][1] for u in users]))
            for f in self.plan.user_features
        }
        queries = self.towers.embed("query", {f: merged[f] for f in self.plan.query_features}, batch)
        t1 = time.perf_counter()
        candidates = self._retrieve(queries, users)
        t2 = time.perf_counter()
        scores = self._rank(merged, torch.cat([u.dense for u in users]), candidates)
        out = []
        for user, rows, score in zip(users, candidates, scores):
            order = _top(score, user.k)
            out.append(
                Recommendation(self.items.item_ids[rows[order]].clone(), score[order].clone(), len(rows))
            )
        times.seconds = {"query": t1 - t0, "retrieval": t2 - t1, "ranking": time.perf_counter() - t2}
        times.candidates = sum(len(c) for c in candidates)
        return out, times

    def _search(self, queries: Tensor, n: int) -> Tensor:
        n = min(n, self.items.rows)
        if self.index is not None:
            return search(self.index, queries, n)[1]
        scores = queries @ self.embeddings.T
        return torch.topk(scores, n, dim=1, sorted=True).indices

    def _retrieve(self, queries: Tensor, users: list[UserRequest]) -> list[Tensor]:
        """Per user, the catalogue positions of its ``num_candidates`` best items not excluded."""
        # Excluded ids may take places in the index's answer: search past them so n candidates remain.
        wanted = max(u.num_candidates + u.exclude.numel() for u in users)
        positions = self._search(queries, wanted)
        out = []
        for user, row in zip(users, positions):
            row = row[row >= 0]
            if user.exclude.numel():
                row = row[~torch.isin(self.items.item_ids[row], user.exclude)]
            out.append(row[: user.num_candidates])
        return out

    def _rank(self, user_bags: Bags, user_dense: Tensor, candidates: list[Tensor]) -> list[Tensor]:
        """The ranking model's scores of every user's candidates, computed as one batch, split per user."""
        counts = torch.tensor([len(c) for c in candidates], dtype=torch.int64)
        rows = torch.cat(candidates)
        total = int(rows.numel())
        if total == 0:
            return [torch.empty(0) for _ in candidates]
        user = {f: user_bags[f] for f in self.plan.ranking_user_features}
        items = item_bags(self.items.features, rows, self.items.widths)
        scores = self.ranking.scores(user, user_dense, counts, items, self.items.dense[rows])
        return list(torch.split(scores, counts.tolist()))


def _top(scores: Tensor, k: int) -> Tensor:
    """Positions of the ``k`` best scores, best first; equal scores keep the retrieval's order (topk's
    order among ties is unspecified, so ties at the boundary are settled by a stable sort of the few)."""
    k = min(k, scores.numel())
    if k == scores.numel():
        return torch.sort(scores, descending=True, stable=True).indices
    kth = torch.topk(scores, k, sorted=False).values.min()
    better = torch.nonzero(scores >= kth).reshape(-1)  # the top k, and any ties of the k-th score
    return better[torch.sort(scores[better], descending=True, stable=True).indices[:k]]
