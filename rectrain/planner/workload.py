"""The traffic one shard sees per iteration: lookups it serves, id bytes it receives, output bytes it sends.

Shared by the storage and perf estimators so that both count the same buffers. Ids are int64 (8 bytes),
outputs fp32 (4 bytes). With a per-rank batch ``b`` and world size ``W``, a shard that receives ids from every
rank sees the global batch ``b * W``; a row-wise shard sees the fraction of those ids that fall in its rows,
assuming ids are spread uniformly over the table. (TorchRec's rule, ``_calculate_shard_io_sizes`` in
``rectrain.distributed.planner.shard_estimators``, differs: it gives every row block ``1 / blocks`` of the
ids, a pooled lookup ``min(1, pooling factor)`` rows per example, and rounds bytes up. It is not used here:
the recorded plans come out the same under it, but an empty row block drops its share of the ids, so a
larger table can look cheaper: 9 rows row wise on 4 ranks cost less than 8, which the perf model forbids.)
"""

from __future__ import annotations

from dataclasses import dataclass

from rectrain.planner.sharding_option import ShardingOption
from rectrain.planner.topology import Topology
from rectrain.planner.types import FP32_BYTES, ID_BYTES, Shard, ShardingType

_ROW_BLOCKED = (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE, ShardingType.GRID_SHARD)


@dataclass(frozen=True)
class ShardWorkload:
    """Per-iteration traffic of one shard: ``lookups`` rows read, ``id_bytes`` in, ``output_bytes`` out."""

    lookups: float
    id_bytes: float
    output_bytes: float


def shard_workload(option: ShardingOption, shard: Shard, topology: Topology) -> ShardWorkload:
    """Traffic of ``shard`` of ``option`` on its rank (data parallel: on every rank, local batch only)."""
    replicas = 1 if option.sharding_type == ShardingType.DATA_PARALLEL else topology.world_size
    lookups = sum(batch * pooling for batch, pooling in option.features) * replicas
    examples = sum(batch for batch, _ in option.features) * replicas
    if option.sharding_type in _ROW_BLOCKED:
        row_fraction = shard.num_rows / option.tensor.shape[0]
    else:
        row_fraction = 1.0
    shard_lookups = lookups * row_fraction
    if option.is_pooled:
        # Pooled: one vector per example; row-wise shards send partial sums for every example.
        outputs = examples
    else:
        outputs = shard_lookups
    return ShardWorkload(
        lookups=shard_lookups,
        id_bytes=shard_lookups * ID_BYTES,
        output_bytes=outputs * shard.num_cols * FP32_BYTES,
    )
