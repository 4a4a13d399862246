import pytest
from torch import nn

from rectrain.distributed.interfaces.sharded_module import ShardedModule
from rectrain.distributed.parallel.dmp_collection import DMPCollectionConfig, DMPCollectionContext
from rectrain.distributed.types import ShardingPlan, ShardingStrategy


def test_configs_compare_by_their_settings_and_print_without_the_plan():
    plan = ShardingPlan({})
    config = DMPCollectionConfig(nn.Linear, plan, sharding_group_size=4)
    assert config == DMPCollectionConfig(nn.Linear, plan, 4, sharding_strategy=ShardingStrategy.DEFAULT)
    assert config != DMPCollectionConfig(nn.Linear, plan, 8)
    assert "plan=" not in repr(config) and "sharding_group_size=4" in repr(config)
    context = DMPCollectionContext(nn.Linear, plan, 4, replica_pg="pg")
    assert context.modules_to_sync == [] and context.weights_by_dtype == {}
    assert "replica_pg" not in repr(context)


def test_a_sharded_module_is_refused_by_name():
    class Sharded(ShardedModule):
        compute = create_context = input_dist = output_dist = None

    sharded = Sharded()
    with pytest.raises(ValueError, match="ShardedModule should not be passed into DMPCollectionConfig"):
        DMPCollectionConfig(sharded, None, 2)
