"""How a pipeline's stages fit together: which features the user sends, which the catalogue holds.

A pipeline is a two-tower retrieval package, a ranking package (DLRM or DCN) and a catalogue. The request
carries the user's features: the query tower's sparse features, the ranking model's sparse features that the
catalogue does not hold, and the ranking model's first dense columns. The catalogue holds the candidate
tower's features, the ranking model's item features and its last dense columns (``dense:<name>``). Anything
that does not fit is refused at export with one line naming the stage, the feature and the problem.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from recserve.errors import ExportError
from recserve.recommend.catalogue import CatalogueColumns
from recserve.runtime.package import PackageManifest
from recserve.runtime.predictor import metadata_for
from rectrain.models.config import ModelConfig


class PipelineError(ExportError):
    """The stages of a pipeline do not fit together (feature names, dims, kinds)."""


@dataclass
class StagePlan:
    """The features each side supplies, and every feature's id bound (the smallest table that reads it)."""

    query_features: list[str]
    candidate_features: list[str]
    embedding_dim: int
    user_features: list[str]  # what a request sends, in this order
    ranking_user_features: list[str]
    ranking_item_features: list[str]
    user_dense: int
    item_dense: list[str]
    num_embeddings: dict[str, int] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> StagePlan:
        return cls(**data)


def _config(manifest: PackageManifest, stage: str) -> ModelConfig:
    return ModelConfig.from_dict(manifest.model_config, where=f"{stage}: model_config")


def plan_stages(
    retrieval: PackageManifest,
    ranking: PackageManifest,
    columns: CatalogueColumns,
    user_dense: int | None = None,
) -> StagePlan:
    """The fitted plan of the stages; PipelineError (one line) naming the first mismatch."""
    tower = _config(retrieval, "retrieval")
    if tower.kind != "two_tower":
        raise PipelineError(
            f"retrieval: the package is a {tower.kind!r} model; retrieval needs a two_tower one"
        )
    rank = _config(ranking, "ranking")
    if rank.kind == "two_tower":
        raise PipelineError("ranking: the package is a two_tower model; ranking needs dlrm or dlrm_dcn")
    query, candidate = tower.tower_features()
    catalogue = set(columns.sparse)
    for feature in candidate:
        if feature not in catalogue:
            raise PipelineError(
                f"retrieval: candidate feature {feature!r} is not a column of the catalogue "
                f"(its sparse columns are {columns.sparse})"
            )
    for feature in query:
        if feature in catalogue:
            raise PipelineError(
                f"retrieval: query feature {feature!r} is also a catalogue column; a feature comes from the "
                "user or from the item, not both"
            )
    rank_features = metadata_for(rank, {}).feature_names
    item_features = [f for f in rank_features if f in catalogue]
    rank_user = [f for f in rank_features if f not in catalogue]
    needed_dense = rank.dense_in_features - len(columns.dense)
    if needed_dense < 0:
        raise PipelineError(
            f"ranking: dense_in_features is {rank.dense_in_features}, fewer than the catalogue's "
            f"{len(columns.dense)} dense columns"
        )
    if user_dense is not None and user_dense != needed_dense:
        raise PipelineError(
            f"ranking: dense_in_features {rank.dense_in_features} = user dense + catalogue dense "
            f"({len(columns.dense)}), so the user sends {needed_dense} dense values, not {user_dense}"
        )
    user = list(dict.fromkeys([*query, *rank_user]))
    bounds: dict[str, int] = {}
    for cfg in (tower, rank):
        for f, n in metadata_for(cfg, {}).num_embeddings.items():
            bounds[f] = min(bounds.get(f, n), n)
    dims = {t.embedding_dim for t in tower.tables}
    return StagePlan(
        query_features=query,
        candidate_features=candidate,
        embedding_dim=tower.tower_layer_sizes[-1] if dims else 0,
        user_features=user,
        ranking_user_features=rank_user,
        ranking_item_features=item_features,
        user_dense=needed_dense,
        item_dense=list(columns.dense),
        num_embeddings={f: bounds[f] for f in [*user, *candidate, *item_features]},
    )
