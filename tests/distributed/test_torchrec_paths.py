"""TorchRec's ``torchrec.distributed`` import paths at rectrain's, and its sharder objects.

A TorchRec script imports its planner from ``torchrec.distributed.planner`` (and ``.types``), its plan
vocabulary from ``torchrec.distributed.types``, and passes ``sharders=[EmbeddingBagCollectionSharder()]`` or
``get_default_sharders()``; with ``torchrec`` changed to ``rectrain`` those imports resolve to rectrain's own
classes, and the sharders let the planner pick every sharding type rectrain runs on CPU.
"""

from __future__ import annotations

import pytest
import torch

from rectrain import EmbeddingBagCollection, EmbeddingBagConfig, EmbeddingCollection
from rectrain.distributed.embedding import EmbeddingCollectionSharder
from rectrain.distributed.embedding_types import EmbeddingComputeKernel
from rectrain.distributed.embeddingbag import EmbeddingBagCollectionSharder
from rectrain.distributed.planner import EmbeddingShardingPlanner, Topology
from rectrain.distributed.planner.planners import EmbeddingShardingPlanner as PlannersPlanner
from rectrain.distributed.planner.types import ParameterConstraints, PlannerError
from rectrain.distributed.sharding_plan import get_default_sharders
from rectrain.distributed.types import ParameterSharding, ShardingEnv, ShardingPlan, ShardingType
from rectrain.errors import ConfigError

TYPES = ["data_parallel", "table_wise", "row_wise", "column_wise", "table_row_wise"]


def _ebc() -> EmbeddingBagCollection:
    tables = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=dim, num_embeddings=rows, feature_names=[f"f{i}"])
        for i, (rows, dim) in enumerate([(101, 16), (40, 64)])
    ]
    return EmbeddingBagCollection(tables=tables, device=torch.device("cpu"))


def test_torchrec_paths_name_rectrains_own_classes():
    import rectrain.planner as planner
    import rectrain.planner.types as types
    from rectrain.distributed.comm.env import ShardingEnv as Env

    assert EmbeddingShardingPlanner is PlannersPlanner is planner.EmbeddingShardingPlanner
    assert (ParameterConstraints, Topology, PlannerError, ShardingPlan) == (
        planner.ParameterConstraints,
        planner.Topology,
        planner.PlannerError,
        planner.ShardingPlan,
    )
    assert (ShardingType, ParameterSharding, EmbeddingComputeKernel) == (
        types.ShardingType,
        types.ParameterSharding,
        types.EmbeddingComputeKernel,
    )
    assert ShardingEnv is Env
    assert ShardingType.ROW_WISE.value == "row_wise"


@pytest.mark.parametrize("sharding_type", TYPES)
def test_a_torchrec_sharder_lets_the_planner_place_every_type(sharding_type):
    ebc = _ebc()
    constraints = {name: ParameterConstraints(sharding_types=[sharding_type]) for name in ("t0", "t1")}
    planner = EmbeddingShardingPlanner(
        topology=Topology(world_size=2, compute_device="cpu"), constraints=constraints
    )
    plan = planner.plan(ebc, [EmbeddingBagCollectionSharder()])
    placed = plan.get_plan_for_module("")
    assert {name: p.sharding_type.value for name, p in placed.items()} == {
        "t0": sharding_type,
        "t1": sharding_type,
    }
    kernel = "dense" if sharding_type == "data_parallel" else "fused"
    assert EmbeddingBagCollectionSharder().compute_kernels(sharding_type, "cpu") == [kernel]


def test_default_sharders_cover_both_collections():
    sharders = get_default_sharders()
    assert [s.module_type for s in sharders] == [EmbeddingBagCollection, EmbeddingCollection]
    assert isinstance(sharders[0], EmbeddingBagCollectionSharder)
    assert isinstance(sharders[1], EmbeddingCollectionSharder)
    assert all(s.sharding_types("cpu") == TYPES for s in sharders)


def test_a_sharders_fused_params_are_kept_or_refused_by_name():
    # TorchRec's fused_params pick the fused optimizer: taken when rectrain's kernels can honour them.
    sharder = EmbeddingBagCollectionSharder(fused_params={"optimizer": "exact_sgd", "learning_rate": 0.1})
    assert sharder.fused_params == {"optimizer": "exact_sgd", "learning_rate": 0.1}
    with pytest.raises(ConfigError, match="optimizer LAMB has no rectrain kernel"):
        EmbeddingBagCollectionSharder(fused_params={"optimizer": "lamb"})
    with pytest.raises(ConfigError, match="momentum=0.9 is not supported"):
        EmbeddingBagCollectionSharder(fused_params={"optimizer": "exact_sgd", "momentum": 0.9})
    with pytest.raises(ConfigError, match="qcomm_codecs_registry"):
        EmbeddingCollectionSharder(qcomm_codecs_registry={"forward": "fp16"})
    assert EmbeddingBagCollectionSharder(fused_params={}).fused_params is None
