"""Row-wise bucketing of a KeyedJaggedTensor (``bucketize_kjt_before_all2all``), TorchRec's op.

Before a row-wise input distribution, each id is assigned to the bucket (rank) whose block of rows holds
it: ``id // block_size`` of its feature, through FBGEMM's ``block_bucketize_sparse_features``. The result
has the input's keys once per bucket (bucket-major), ready for a KJT all-to-all; each id becomes its row
within its bucket unless ``keep_original_indices``.
"""

from dataclasses import dataclass
from typing import Any

import fbgemm_gpu  # noqa: F401 - registers torch.ops.fbgemm
import torch
from torch import Tensor

from rectrain.sparse import KeyedJaggedTensor


@torch.fx.wrap
def _as_values_tensor(t: Tensor, like: Tensor) -> Tensor:
    return t.to(device=like.device, dtype=like.dtype)


@torch.fx.wrap
def _rows_per_feature(kjt: KeyedJaggedTensor) -> Tensor | None:
    if not kjt.variable_stride_per_key():
        return None
    return torch.tensor(kjt.stride_per_key(), device=kjt.device(), dtype=kjt.lengths().dtype)


@torch.fx.wrap
def _max_rows(kjt: KeyedJaggedTensor) -> int:
    return max(kjt.stride_per_key()) if kjt.variable_stride_per_key() else -1


@torch.fx.wrap
def _bucketed_kjt(
    kjt: KeyedJaggedTensor, num_buckets: int, values: Tensor, lengths: Tensor, weights: Tensor | None
) -> KeyedJaggedTensor:
    variable = kjt.variable_stride_per_key()
    keys: list[str] = []
    for _ in range(num_buckets):
        keys.extend(kjt.keys())
    return KeyedJaggedTensor(
        keys=keys,
        values=values,
        weights=weights,
        lengths=lengths.view(-1),
        stride=None if variable else kjt.stride(),
        stride_per_key_per_rank=kjt.stride_per_key_per_rank() * num_buckets if variable else None,
    )


def bucketize_kjt_before_all2all(
    kjt: KeyedJaggedTensor,
    num_buckets: int,
    block_sizes: Tensor,
    total_num_blocks: Tensor | None = None,
    output_permute: bool = False,
    bucketize_pos: bool = False,
    block_bucketize_row_pos: list[Tensor] | None = None,
    keep_original_indices: bool = False,
) -> tuple[KeyedJaggedTensor, Tensor | None]:
    """``kjt``'s ids split into ``num_buckets`` buckets of rows, and where each id went.

    Args:
        kjt: the features.
        num_buckets: buckets (ranks) of the row-wise sharding.
        block_sizes: rows per bucket of each feature (``[num features]``).
        total_num_blocks: per feature, blocks of a two-level bucketing (ids go to block ``id // block``,
            blocks to buckets in turn); None: one level.
        output_permute: also return, for each id, its position in the bucketed values.
        bucketize_pos: the result's weights are each id's position within its row (instead of its weight).
        block_bucketize_row_pos: per feature, the first row of each bucket (uneven buckets).
        keep_original_indices: ids keep their value (default: reduced to the row within the bucket).
    """
    if block_sizes.numel() != len(kjt.keys()):
        raise ValueError(
            f"need a block size for each of the {len(kjt.keys())} features, got {block_sizes.numel()}"
        )
    values = kjt.values()
    lengths, ids, weights, positions, permute = torch.ops.fbgemm.block_bucketize_sparse_features(
        kjt.lengths().view(-1),
        values,
        bucketize_pos=bucketize_pos,
        sequence=output_permute,
        block_sizes=_as_values_tensor(block_sizes, values),
        total_num_blocks=None if total_num_blocks is None else _as_values_tensor(total_num_blocks, values),
        my_size=num_buckets,
        weights=kjt.weights_or_none(),
        batch_size_per_feature=_rows_per_feature(kjt),
        max_B=_max_rows(kjt),
        block_bucketize_pos=(
            None
            if block_bucketize_row_pos is None
            else [_as_values_tensor(p, values) for p in block_bucketize_row_pos]
        ),
        keep_orig_idx=keep_original_indices,
    )
    return _bucketed_kjt(kjt, num_buckets, ids, lengths, positions if bucketize_pos else weights), permute


@dataclass
class ShardingBucketMetadata:
    """A row-wise table cut into equal buckets: buckets in each shard, each shard's first bucket, rows per
    bucket (TorchRec's ``ShardingBucketMetadata``)."""

    num_buckets_per_shard: list[int]
    bucket_offsets_per_shard: list[int]
    bucket_size: int


def get_bucket_metadata_from_shard_metadata(shards: list[Any], num_buckets: int) -> ShardingBucketMetadata:
    """The buckets of a row-wise table's shards (``ShardMetadata``) when its rows are cut into
    ``num_buckets`` equal buckets; AssertionError, as TorchRec's, when they do not divide evenly."""
    assert len(shards) > 0, "Shards cannot be empty"
    table_size = shards[-1].shard_offsets[0] + shards[-1].shard_sizes[0]
    assert table_size % num_buckets == 0, (
        f"Table size '{table_size}' must be divisible by num_buckets '{num_buckets}'"
    )
    size = table_size // num_buckets
    metadata = ShardingBucketMetadata([], [], size)
    for shard in shards:
        assert len(shard.shard_offsets) == 1 or shard.shard_offsets[1] == 0, (
            f"Shard shard_offsets[1] '{shard.shard_offsets[1]}' is not 0. Table should be only row-wise "
            "sharded for bucketization"
        )
        assert shard.shard_sizes[0] % size == 0, (
            f"Shard size[0] '{shard.shard_sizes[0]}' is not divisible by bucket size '{size}'"
        )
        metadata.bucket_offsets_per_shard.append(sum(metadata.num_buckets_per_shard))
        metadata.num_buckets_per_shard.append(shard.shard_sizes[0] // size)
    return metadata
