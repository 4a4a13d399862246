"""``RowCounts``: one int32 counter per row of a rank's shards, bumped from the routed (feature-major,
shard-local) ids of each batch; a table read by two features counts both."""

from __future__ import annotations

import torch

from rectrain.distributed.routing.input_dist import ShardInput
from rectrain.distributed.sharded.row_counts import RowCounts
from rectrain.embedding.config import EmbeddingBagConfig, FusedOptimizerConfig, PoolingType
from rectrain.embedding.fused_tables import FusedTables
from rectrain.embedding.table_batch import pooling_mode


def test_counts_follow_the_routed_ids_of_every_feature():
    tables = [
        EmbeddingBagConfig(name="a#0", num_embeddings=7, embedding_dim=4, feature_names=["x", "y"]),
        EmbeddingBagConfig(name="b#1", num_embeddings=5, embedding_dim=4, feature_names=["z"]),
    ]
    kernels = FusedTables(
        tables, [[0, 1]], [pooling_mode(PoolingType.SUM)], FusedOptimizerConfig(), torch.device("cpu"), "t"
    )
    counts = RowCounts(kernels)
    gen = torch.Generator().manual_seed(0)
    expected = {"a#0": torch.zeros(7, dtype=torch.int32), "b#1": torch.zeros(5, dtype=torch.int32)}
    for _ in range(3):
        batch = [2, 3]  # two source ranks
        lengths = torch.randint(0, 4, (3, sum(batch)), generator=gen)
        ids = [torch.randint(0, n, (int(lengths[f].sum()),), generator=gen) for f, n in enumerate([7, 7, 5])]
        offsets = torch.cat([torch.zeros(1, dtype=torch.long), lengths.reshape(-1).cumsum(0)])
        counts.observe(ShardInput(torch.cat(ids), offsets, None, batch))
        expected["a#0"] += torch.bincount(torch.cat(ids[:2]), minlength=7).int()
        expected["b#1"] += torch.bincount(ids[2], minlength=5).int()
    for name, value in expected.items():
        assert counts.of(name).dtype == torch.int32
        assert torch.equal(counts.of(name), value), name
