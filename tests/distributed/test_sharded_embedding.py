"""Sharded EmbeddingCollection on real gloo ranks matches the unsharded collection on the global batch.

Every rank builds the same unsharded collection (same seed), keeps a deep copy as the reference, shards the
original and trains both for 5 steps: the reference on the global batch, each rank on its own slice (batch
sizes differ per rank). Per-id rows must agree at every step and, after training, every rank's shards must
equal the matching rectangles of the reference tables. Tolerance: 1e-5 absolute / 1e-4 relative.

Tables have different dims (8, 4, 12), so the shards of one rank run in several sequence kernels and rows of
different widths share the output all-to-all; ``f_a`` is read by three tables (keys ``f_a@<table>``).
"""

from __future__ import annotations

import copy

import pytest
import torch

from rectrain.distributed.comm.env import ShardingEnv
from rectrain.distributed.sharded.embedding import ShardedEmbeddingCollection
from rectrain.distributed.sharding_plan import (
    column_wise,
    construct_module_sharding_plan,
    data_parallel,
    row_wise,
    table_wise,
)
from rectrain.embedding import EmbeddingCollection
from rectrain.embedding.config import EmbeddingConfig, EmbOptimType, FusedOptimizerConfig
from rectrain.errors import ConfigError
from rectrain.sparse import KeyedJaggedTensor
from tests.distributed.batches import TOL, assert_shards_match, global_batch, local_kjt
from tests.distributed.multiprocess import run_multiprocess

FEATURES = ["f_a", "f_b", "f_c", "f_d", "f_e"]
ROWS = {"f_a": 20, "f_b": 40, "f_c": 30, "f_d": 30, "f_e": 20}


def _tables() -> list[EmbeddingConfig]:
    return [
        EmbeddingConfig(name="t_tw", num_embeddings=40, embedding_dim=8, feature_names=["f_a", "f_b"]),
        EmbeddingConfig(name="t_rw", num_embeddings=50, embedding_dim=4, feature_names=["f_c", "f_a"]),
        EmbeddingConfig(name="t_rw2", num_embeddings=31, embedding_dim=8, feature_names=["f_d", "f_a"]),
        EmbeddingConfig(name="t_cw", num_embeddings=30, embedding_dim=12, feature_names=["f_d"]),
        EmbeddingConfig(name="t_dp", num_embeddings=20, embedding_dim=4, feature_names=["f_e"]),
    ]


def _plan(kinds: dict[str, str], world_size: int) -> dict:
    dims = {t.name: t.embedding_dim for t in _tables()}
    makers = {
        "tw": lambda table: table_wise(rank=world_size - 1),
        "rw": lambda table: row_wise(),
        # Blocks of 4 columns dealt round-robin: a table may have two column shards on one rank.
        "cw": lambda table: column_wise(ranks=[r % world_size for r in range(dims[table] // 4)]),
        "dp": lambda table: data_parallel(),
    }
    return {table: makers[kind](table) for table, kind in kinds.items()}


def _local_kjt(lengths: torch.Tensor, values: torch.Tensor, start: int, size: int) -> KeyedJaggedTensor:
    """Examples ``[start, start + size)`` of the global batch, keys reversed plus one unread key."""
    return local_kjt(lengths, values, None, FEATURES, start, size, key_order=FEATURES[::-1])


def _train_and_compare(env, kinds: dict[str, str], optimizer: str) -> int:
    torch.manual_seed(0)
    config = FusedOptimizerConfig(optimizer=EmbOptimType(optimizer), lr=0.1)
    ec = EmbeddingCollection(_tables(), need_indices=True, fused_optimizer=config)
    reference = copy.deepcopy(ec)
    plan = construct_module_sharding_plan(ec, _plan(kinds, env.world_size), world_size=env.world_size)
    sharded = ShardedEmbeddingCollection(ec, plan, env, torch.device("cpu"))
    batch_sizes = [3 + 2 * r for r in range(env.world_size)]
    start, total = sum(batch_sizes[: env.rank]), sum(batch_sizes)
    for step in range(5):
        lengths, values, _ = global_batch(step, ROWS, total)
        expected = reference(_local_kjt(lengths, values, 0, total))
        got = sharded(_local_kjt(lengths, values, start, batch_sizes[env.rank]))
        assert list(got) == list(expected)
        loss, ref_loss = torch.zeros(()), torch.zeros(())
        for key, jt in expected.items():
            target = torch.randn(jt.values().shape, generator=torch.Generator().manual_seed(step))
            ref_loss = ref_loss + (jt.values() * target).sum()
            # This rank's ids are a contiguous run of the feature's global ids.
            lo = int(jt.lengths()[:start].sum())
            n = int(got[key].lengths().sum())
            torch.testing.assert_close(got[key].values(), jt.values()[lo : lo + n].detach(), **TOL)
            torch.testing.assert_close(
                got[key].lengths(), jt.lengths()[start : start + len(got[key].lengths())]
            )
            torch.testing.assert_close(got[key].weights(), jt.weights()[lo : lo + n])
            loss = loss + (got[key].values() * target[lo : lo + n]).sum()
        (ref_loss / env.world_size).backward()  # the mean of the ranks' losses, as TorchRec
        loss.backward()
    assert_shards_match(sharded.sharded_state(), reference.state_dict())
    return env.rank


MIXED = {"t_tw": "tw", "t_rw": "rw", "t_rw2": "rw", "t_cw": "cw", "t_dp": "dp"}


@pytest.mark.parametrize("world_size", [2, 3])
def test_mixed_sharding_types_match_unsharded_training(world_size):
    result = run_multiprocess(_train_and_compare, world_size, MIXED, "sgd", timeout=60)
    assert result == list(range(world_size))


# Row-wise Adagrad keeps one accumulator per row per column shard (as TorchRec), so column-wise is checked
# with element-wise Adagrad, which column shards reproduce exactly.
@pytest.mark.parametrize(
    ("kind", "optimizer"), [("tw", "rowwise_adagrad"), ("rw", "adagrad"), ("cw", "adagrad")]
)
def test_each_sharding_type_alone(kind, optimizer):
    kinds = {t: kind for t in MIXED}
    assert run_multiprocess(_train_and_compare, 2, kinds, optimizer, timeout=60) == [0, 1]


def test_missing_table_in_plan_names_it():
    ec = EmbeddingCollection(_tables())
    plan = construct_module_sharding_plan(ec, {"t_tw": table_wise(rank=0)}, world_size=1)
    with pytest.raises(ConfigError, match="t_rw"):
        ShardedEmbeddingCollection(ec, plan, ShardingEnv(world_size=1, rank=0), torch.device("cpu"))
