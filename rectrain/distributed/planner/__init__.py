"""``torchrec.distributed.planner`` at rectrain's path (the planner lives in ``rectrain.planner``).

TorchRec code imports its planner from here; changing ``torchrec`` to ``rectrain`` keeps that import working.
"""

from rectrain.planner.constraints import ParameterConstraints
from rectrain.planner.planner import EmbeddingShardingPlanner
from rectrain.planner.topology import Topology

__all__ = ["EmbeddingShardingPlanner", "ParameterConstraints", "Topology"]
