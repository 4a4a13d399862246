"""Where every id of a sharded collection goes, and where every pooled column comes back to.

Table-wise, column-wise, row-wise and table-row-wise sharding are one mechanism seen from the ids' side: each
id of feature ``f`` (table ``t``) is sent to the shards of ``t`` whose rows contain it, each shard pools what
it received, and the pooled pieces travel back to be placed (column shards side by side) or added (row shards)
into the collection's output. ``Routing`` is that mechanism computed once from the plan: pure data, no tensors
on a device, no communication.

A *stream* is what one rank receives for one (feature, shard) pair. A rank's streams are ordered table by
table (its shards in plan order, each shard's features in table order), which is exactly the feature order of
the FBGEMM kernel that holds the rank's shards, so streams need no reordering on arrival beyond
source-major to feature-major.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from rectrain.embedding.config import EmbeddingBagConfig, PoolingType
from rectrain.embedding.layout import get_embedding_names_by_table
from rectrain.errors import ConfigError
from rectrain.planner.types import ParameterSharding, Shard, ShardingType

ROUTED_TYPES = (
    ShardingType.TABLE_WISE,
    ShardingType.COLUMN_WISE,
    ShardingType.ROW_WISE,
    ShardingType.TABLE_ROW_WISE,
)
_ROW_SPLIT_TYPES = (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE)


@dataclass(frozen=True)
class Stream:
    """The ids of one feature that one shard receives, and where its pooled columns go.

    ``segment`` indexes the sender's segment list (see ``Routing.segments``); ``out_col`` is the first output
    column (in the collection's ``KeyedTensor``) of this shard's ``num_cols`` columns.
    """

    name: str
    segment: int
    out_col: int
    num_cols: int


@dataclass(frozen=True)
class BucketGroup:
    """Row-split features bucketised together by FBGEMM's ``block_bucketize_sparse_features``.

    Bucket ``p`` of feature ``features[j]`` holds the ids in rows
    ``[p * block_sizes[j], (p+1) * block_sizes[j])`` (shifted to shard-local ids) and goes to ``ranks[p]``
    of that feature's table.
    """

    features: tuple[int, ...]
    block_sizes: tuple[int, ...]
    num_buckets: int


@dataclass(frozen=True)
class Routing:
    """The static routing of one sharded collection over ``world_size`` ranks.

    ``features``: the KJT keys the sharded tables read, in a fixed order (sender segments ``0..F-1``).
    ``bucket_groups``: row-split features; their buckets are sender segments ``F, F+1, ...`` (group by group,
    bucket-major, then feature), exactly the layout ``block_bucketize_sparse_features`` returns.
    ``streams[r]``: what rank r receives, in its kernel's feature order. ``shard_tables[r]``: the tables of
    rank r's kernel (one per shard), whose ``feature_names`` are the stream names.
    ``embedding_names`` / ``embedding_dims``: the collection's output keys and widths, in table order.
    ``mean_features``: for each output key pooled with MEAN, the index in ``features`` whose lengths divide it
    (shards always pool SUM, because a row shard only sees part of each bag).
    """

    world_size: int
    features: tuple[str, ...]
    bucket_groups: tuple[BucketGroup, ...]
    streams: tuple[tuple[Stream, ...], ...]
    shard_tables: tuple[tuple[EmbeddingBagConfig, ...], ...]
    embedding_names: tuple[str, ...]
    embedding_dims: tuple[int, ...]
    mean_features: tuple[tuple[int, int, int], ...]

    @property
    def output_dim(self) -> int:
        return sum(self.embedding_dims)

    def dims_per_rank(self) -> list[int]:
        """Width of each rank's pooled kernel output."""
        return [sum(stream.num_cols for stream in streams) for streams in self.streams]


def _check_shards(table: EmbeddingBagConfig, sharding: ParameterSharding, world_size: int) -> list[Shard]:
    kind = sharding.sharding_type
    if kind not in ROUTED_TYPES:
        raise ConfigError(
            f"table {table.name!r}: sharding type {kind} is not routed (data-parallel is separate)"
        )
    shards = sharding.sharding_spec or []
    if not shards:
        raise ConfigError(f"table {table.name!r}: {kind} sharding has no shards")
    for index, shard in enumerate(shards):
        if shard.rank is None or not 0 <= shard.rank < world_size:
            raise ConfigError(
                f"table {table.name!r}: shard {index} has rank {shard.rank}, expected 0..{world_size - 1}"
            )
    if kind in _ROW_SPLIT_TYPES:
        block = shards[0].num_rows
        for index, shard in enumerate(shards):
            expected = (index * block, min(block, table.num_embeddings - index * block))
            if (shard.row_offset, shard.num_rows) != expected or shard.num_cols != table.embedding_dim:
                raise ConfigError(
                    f"table {table.name!r}: {kind} shard {index} covers rows "
                    f"{shard.row_offset}+{shard.num_rows}, "
                    f"cols {shard.col_offset}+{shard.num_cols}; "
                    f"row shards must be equal blocks of {block} rows "
                    f"in order (the last may be shorter), each with all {table.embedding_dim} columns"
                )
        if block * len(shards) < table.num_embeddings:
            raise ConfigError(
                f"table {table.name!r}: {len(shards)} row shards of {block} rows miss some rows"
            )
    else:
        col = 0
        for index, shard in enumerate(shards):
            if (shard.row_offset, shard.num_rows) != (0, table.num_embeddings) or shard.col_offset != col:
                raise ConfigError(
                    f"table {table.name!r}: {kind} shard {index} must hold all {table.num_embeddings} rows "
                    f"and start at column {col}; got rows {shard.row_offset}+{shard.num_rows}, "
                    f"col {shard.col_offset}"
                )
            col += shard.num_cols
        if col != table.embedding_dim:
            raise ConfigError(
                f"table {table.name!r}: column shards cover {col} of {table.embedding_dim} columns"
            )
    return shards


def build_routing(
    tables: Sequence[EmbeddingBagConfig], shardings: Mapping[str, ParameterSharding], world_size: int
) -> Routing:
    """Routing of the ``tables`` that ``shardings`` shards with a routed type (tables it omits are skipped).

    Output keys and widths cover the routed tables only, in table order, named as the unsharded collection
    names them.
    """
    names_by_table = get_embedding_names_by_table(tables)
    routed = [(t, n) for t, n in zip(tables, names_by_table) if t.name in shardings]
    features = list(dict.fromkeys(f for table, _ in routed for f in table.feature_names))
    feature_index = {name: i for i, name in enumerate(features)}

    out_cols, embedding_names, embedding_dims, mean_features = {}, [], [], []
    for table, names in routed:
        for feature, name in zip(table.feature_names, names):
            out_cols[(table.name, feature)] = sum(embedding_dims)
            if table.pooling is PoolingType.MEAN:
                mean_features.append((feature_index[feature], sum(embedding_dims), table.embedding_dim))
            embedding_names.append(name)
            embedding_dims.append(table.embedding_dim)

    # Row-split (table, feature) pairs: one bucket group per bucket count (row-wise: world size;
    # table-row-wise: host size). A feature read by two row-split tables is bucketised once per table
    # (their blocks differ).
    groups: dict[int, list[tuple[str, int, int]]] = {}
    table_shards = {t.name: _check_shards(t, shardings[t.name], world_size) for t, _ in routed}
    for table, _ in routed:
        if shardings[table.name].sharding_type in _ROW_SPLIT_TYPES:
            shards = table_shards[table.name]
            for feature in table.feature_names:
                groups.setdefault(len(shards), []).append(
                    (table.name, feature_index[feature], shards[0].num_rows)
                )
    bucket_groups, bucket_segment, next_segment = [], {}, len(features)
    for num_buckets, members in sorted(groups.items()):
        for bucket in range(num_buckets):
            for position, (table_name, feature, _) in enumerate(members):
                bucket_segment[(table_name, feature, bucket)] = (
                    next_segment + bucket * len(members) + position
                )
        next_segment += num_buckets * len(members)
        bucket_groups.append(
            BucketGroup(tuple(f for _, f, _ in members), tuple(b for _, _, b in members), num_buckets)
        )

    streams: list[list[Stream]] = [[] for _ in range(world_size)]
    shard_tables: list[list[EmbeddingBagConfig]] = [[] for _ in range(world_size)]
    for table, names in routed:
        row_split = shardings[table.name].sharding_type in _ROW_SPLIT_TYPES
        for index, shard in enumerate(table_shards[table.name]):
            if shard.num_rows == 0:
                continue  # more row shards than rows: this one holds nothing and receives nothing
            rank_streams = []
            for feature, name in zip(table.feature_names, names):
                f = feature_index[feature]
                segment = bucket_segment[(table.name, f, index)] if row_split else f
                out_col = out_cols[(table.name, feature)] + shard.col_offset
                rank_streams.append(Stream(f"{name}#{index}", segment, out_col, shard.num_cols))
            streams[shard.rank].extend(rank_streams)
            shard_tables[shard.rank].append(
                replace(
                    table,
                    name=f"{table.name}#{index}",
                    num_embeddings=shard.num_rows,
                    embedding_dim=shard.num_cols,
                    feature_names=[s.name for s in rank_streams],
                    pooling=PoolingType.SUM,
                    weight_init_min=table.get_weight_init_min(),
                    weight_init_max=table.get_weight_init_max(),
                )
            )
    return Routing(
        world_size=world_size,
        features=tuple(features),
        bucket_groups=tuple(bucket_groups),
        streams=tuple(tuple(s) for s in streams),
        shard_tables=tuple(tuple(t) for t in shard_tables),
        embedding_names=tuple(embedding_names),
        embedding_dims=tuple(embedding_dims),
        mean_features=tuple(mean_features),
    )
