"""Kernel groups of a rank's shards (TorchRec's ``group_tables`` rules), TorchRec's sharded-module protocol
(awaitables, ``ShardedEmbeddingModule``, contexts) and the kernels rectrain refuses by name."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rectrain.distributed.embedding import EmbeddingCollectionAwaitable, EmbeddingCollectionContext
from rectrain.distributed.embedding_lookup import GroupedEmbeddingsLookup
from rectrain.distributed.interfaces.awaitable import LazyAwaitable, NoWait
from rectrain.distributed.interfaces.contexts import SequenceShardingContext, set_sharding_context_post_a2a
from rectrain.distributed.interfaces.sharded_module import ShardedEmbeddingModule
from rectrain.distributed.interfaces.table_groups import ShardedEmbeddingTable, group_tables
from rectrain.embedding.config import DataType, PoolingType
from rectrain.errors import ConfigError
from rectrain.planner import ParameterConstraints, ParameterSharding
from rectrain.planner.types import EmbeddingComputeKernel as K
from rectrain.sparse import KeyedJaggedTensor


def _table(name: str, **kw) -> ShardedEmbeddingTable:
    kw.setdefault("compute_kernel", K.FUSED)
    kw.setdefault("local_cols", 8)
    kw.setdefault("feature_names", [f"{name}_feature"])
    return ShardedEmbeddingTable(num_embeddings=100, embedding_dim=8, name=name, **kw)


def _names(tables: list[ShardedEmbeddingTable]) -> list[list[str]]:
    return [group.table_names() for group in group_tables([tables])[0]]


def test_one_kernel_for_shards_that_agree_and_widths_do_not_split_uncached_groups():
    tables = [_table("a"), _table("b", local_cols=4), _table("c", compute_kernel=K.FUSED_UVM)]
    assert _names(tables) == [["a", "b", "c"]]
    (group,) = group_tables([tables])[0]
    assert group.compute_kernel == K.FUSED and group.dim_sum() == 20 and group.fused_params == {}


@pytest.mark.parametrize(
    "other",
    [
        {"data_type": DataType.FP16},
        {"pooling": PoolingType.MEAN},
        {"has_feature_processor": True},
        {"compute_kernel": K.DENSE},
        {"fused_params": {"learning_rate": 0.1}},
        {"fused_params": {"use_one_tbe_per_table": True}},
    ],
)
def test_what_a_kernel_cannot_mix_splits_groups(other):
    assert _names([_table("a"), _table("b", **other)]) == [["a"], ["b"]]


def test_cached_prefetched_tables_group_by_row_width_and_average_their_cache_load_factor():
    cached = {"compute_kernel": K.FUSED_UVM_CACHING}
    prefetch = {"prefetch_pipeline": True}
    tables = [
        _table("a", fused_params={"prefetch_pipeline": True, "cache_load_factor": 0.5}, **cached),
        _table("b", fused_params={**prefetch, "cache_load_factor": 0.2}, local_cols=4, **cached),
        ShardedEmbeddingTable(
            num_embeddings=300,
            embedding_dim=8,
            name="c",
            local_cols=8,
            fused_params={"prefetch_pipeline": True, "cache_load_factor": 0.1},
            **cached,
        ),
    ]
    groups = group_tables([tables])[0]
    assert [g.table_names() for g in groups] == [["a", "c"], ["b"]]
    assert groups[0].fused_params == {"prefetch_pipeline": True, "cache_load_factor": pytest.approx(0.2)}


def test_shards_of_one_table_share_its_own_kernel_and_weightedness_must_agree():
    one = {"fused_params": {"use_one_tbe_per_table": True}}
    tables = [_table("a", **one), _table("b"), _table("a", **one), _table("c")]
    assert _names(tables) == [["a", "a"], ["b", "c"]]
    with pytest.raises(ValueError, match="weighted"):
        group_tables([[_table("a", is_weighted=True)], [_table("b")]])


def test_torchrec_kernel_names_parse_but_plans_refuse_them_by_name():
    assert ParameterConstraints(compute_kernels=["fused_uvm_caching", "fused"]).compute_kernels
    with pytest.raises(ConfigError, match="fused_uvm_caching.*host memory behind a GPU cache"):
        ParameterSharding("table_wise", "fused_uvm_caching", [0])
    with pytest.raises(ConfigError, match="FusedTables|DistributedModelParallel"):
        GroupedEmbeddingsLookup([])


def test_post_all_to_all_batch_sizes_are_per_rank_per_feature():
    kjt = KeyedJaggedTensor(
        keys=["f", "g"],
        values=torch.ones(10, dtype=torch.int64),
        lengths=torch.ones(10, dtype=torch.int32),
        stride_per_key_per_rank=[[1, 2], [3, 4]],
    )
    ctx = EmbeddingCollectionContext(sharding_contexts=[SequenceShardingContext()])
    set_sharding_context_post_a2a([kjt], ctx)
    assert ctx.sharding_contexts[0].batch_size_per_rank_per_feature == [[1, 3], [2, 4]]


def test_embedding_collection_awaitable_rebuilds_jagged_tensors_per_name():
    kjt = KeyedJaggedTensor(
        keys=["f", "g"], values=torch.tensor([5, 6, 7]), lengths=torch.tensor([1, 0, 1, 1])
    )
    unique_rows = torch.tensor([[0.0, 1.0], [2.0, 3.0]])
    ctx = EmbeddingCollectionContext(reverse_indices=[torch.tensor([1, 0, 1])])
    for gather in (False, True):
        out = EmbeddingCollectionAwaitable(
            [NoWait(unique_rows)], [kjt], [["f", "g"]], ctx, need_indices=True, use_gather_select=gather
        ).wait()
        assert out["f"].values().tolist() == [[2.0, 3.0]] and out["f"].lengths().tolist() == [1, 0]
        assert out["g"].values().tolist() == [[0.0, 1.0], [2.0, 3.0]]
        assert out["g"].weights().tolist() == [6, 7]


class _Doubler(LazyAwaitable[torch.Tensor]):
    def __init__(self, value: torch.Tensor) -> None:
        super().__init__()
        self.value, self.calls = value, 0

    def _wait_impl(self) -> torch.Tensor:
        self.calls += 1
        return self.value * 2


class _ShardedDoubler(ShardedEmbeddingModule):
    def __init__(self) -> None:
        super().__init__()
        self._lookups = [nn.Linear(1, 1)]

    def create_context(self) -> dict:
        return {}

    def input_dist(self, ctx, x):
        return NoWait(NoWait(x + 1))

    def compute(self, ctx, dist_input):
        return dist_input

    def output_dist(self, ctx, output):
        return _Doubler(output)


def test_sharded_module_runs_its_stages_and_lazy_results_wait_once_when_used():
    module = _ShardedDoubler()
    out = module(torch.tensor([1.0]))
    assert isinstance(out, LazyAwaitable) and out.calls == 0
    assert torch.add(out, 1).tolist() == [5.0] and out.shape == (1,) and out.calls == 1
    module.eval()
    assert not module._lookups[0].training
