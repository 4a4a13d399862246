"""``torchrec.distributed.planner.proposers`` at rectrain's path (``rectrain.planner.proposers``);
``EmbeddingOffloadScaleupProposer`` (the UVM-cache scale-up) is refused by name."""

from rectrain.planner.proposers import (
    DynamicProgrammingProposer,
    GreedyProposer,
    GridSearchProposer,
    UniformProposer,
    proposers_to_proposals_list,
)
from rectrain.planner.refusals import refused_class, refusing_getattr

EmbeddingOffloadScaleupProposer = refused_class(__name__, "EmbeddingOffloadScaleupProposer")

__all__ = [
    "DynamicProgrammingProposer",
    "EmbeddingOffloadScaleupProposer",
    "GreedyProposer",
    "GridSearchProposer",
    "UniformProposer",
    "proposers_to_proposals_list",
]

__getattr__ = refusing_getattr(__name__)
