"""``EmbeddingBagCollection``: pooled lookups of several tables (``torchrec``'s EBC).

Built as TorchRec builds it, each table is a parameter with a gradient that the user's optimizer steps
(``dense_tables``). Built with ``fused_optimizer=``, all tables that share a pooling mode and data type go
through one FBGEMM TBE call with the optimizer fused into its backward, so no embedding gradient is
materialised.
"""

import logging
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from rectrain.embedding import dense_tables, init, pt2_lookup
from rectrain.embedding.config import EmbeddingBagConfig, FusedOptimizerConfig, PoolingType
from rectrain.embedding.feature_routing import FeatureRouter, KJTLike
from rectrain.embedding.fused_tables import FusedTables
from rectrain.embedding.layout import check_table_names, get_embedding_names_by_table, group_tables
from rectrain.embedding.lookup_call import PooledLookupCall
from rectrain.embedding.pooling import divide_by_bag_lengths
from rectrain.embedding.table_batch import pooling_mode
from rectrain.errors import ConfigError
from rectrain.optim.fused import FusedEmbeddingOptimizer
from rectrain.sparse import KeyedJaggedTensor, KeyedTensor

logger = logging.getLogger(__name__)


def _output_columns(tables: Sequence[EmbeddingBagConfig], groups: Sequence[Sequence[int]]) -> Tensor | None:
    """Column order that turns the TBE outputs (concatenated in group order) into table order.

    None when the groups already are in table order (one group, or groups that do not interleave).
    """
    starts, column = {}, 0
    for group in groups:
        for index in group:
            starts[index] = column
            column += tables[index].embedding_dim * tables[index].num_features
    order = [
        starts[index] + offset
        for index, table in enumerate(tables)
        for offset in range(table.embedding_dim * table.num_features)
    ]
    return None if order == list(range(column)) else torch.tensor(order, dtype=torch.int64)


class EmbeddingBagCollection(nn.Module):
    """Pooled embeddings of several features, one ``KeyedTensor`` out (``torchrec.EmbeddingBagCollection``).

    ``forward(kjt)`` returns a ``KeyedTensor`` whose keys are the embedding names in table order (each table's
    ``feature_names``; a feature read by several tables becomes ``"<feature>@<table>"``, as in TorchRec) and
    whose values are ``[batch, sum of dims]``. The KJT may carry its keys in any order and extra keys.

    Args:
        tables: the tables; names must be unique.
        is_weighted: pool ``sum(weight * row)`` using ``kjt.weights()`` as per-id weights.
        device: where the tables live and the kernels run (cpu or cuda), or ``meta`` to describe the tables
            without allocating them (for ``DistributedModelParallel`` to build only this rank's shards);
            default: torch's current default device (cpu, or the device of a ``with torch.device(...)``).
        fused_optimizer: the optimizer applied inside backward (FBGEMM kernels). Without it, as in TorchRec,
            ``embedding_bags.<table>`` is an ``nn.EmbeddingBag`` whose weight the model's optimizer updates
            (and ``DistributedModelParallel`` takes the optimizer TorchRec's way).

    State dict keys are ``embedding_bags.<table>.weight`` (fused: views of the kernel storage; loading copies
    into it). ``.to()`` / ``.to_empty()`` move either kind (a fused collection rebuilds its kernels on the new
    device). Initial values are a function of ``init_seed`` (drawn from torch's default generator when the
    collection is built), the table and the row (``rectrain.embedding.init``), fused or not: sharding never
    changes them.
    """

    __jit_unused_properties__ = ["device", "fused_optimizer"]  # Python objects: not for TorchScript

    def __init__(
        self,
        tables: list[EmbeddingBagConfig],
        is_weighted: bool = False,
        device: torch.device | str | None = None,
        *,
        fused_optimizer: FusedOptimizerConfig | None = None,
    ) -> None:
        super().__init__()
        check_table_names(tables)
        for position, table in enumerate(tables):
            if not isinstance(table, EmbeddingBagConfig):
                raise ConfigError(
                    f"tables[{position}] must be an EmbeddingBagConfig, got {type(table).__name__}"
                )
        self._embedding_bag_configs = list(tables)
        self._is_weighted = is_weighted
        self._device = torch.device(device) if device is not None else torch.empty(0).device
        self.init_seed = init.draw_seed()
        self.fused_optimizer_config = fused_optimizer
        if fused_optimizer is None:
            self._init_dense()
            return
        groups = group_tables(
            self._embedding_bag_configs, key=lambda t: (self._kernel_pooling(t), t.data_type, t.storage)
        )
        self.embedding_bags = FusedTables(
            self._embedding_bag_configs,
            groups,
            [pooling_mode(self._kernel_pooling(tables[group[0]])) for group in groups],
            self.fused_optimizer_config,
            self._device,
            prefix="embedding_bags",
        )
        kernels = self.embedding_bags.group_tables
        self._router = FeatureRouter([[f for t in ts for f in t.feature_names] for ts in kernels])
        self._mean_spans = [self._divided_mean_spans(tables) for tables in kernels]
        names = get_embedding_names_by_table(self._embedding_bag_configs)
        self._embedding_names = [name for table_names in names for name in table_names]
        self._lengths_per_embedding = [t.embedding_dim for t in tables for _ in t.feature_names]
        columns = _output_columns(self._embedding_bag_configs, groups)
        # A buffer, so that it moves with the tables (not saved: it follows from the configs).
        self.register_buffer("_columns", None if columns is None else columns.to(self._device), False)
        self._lookup = PooledLookupCall(self._pooled)
        self.reset_parameters()
        logger.debug("EmbeddingBagCollection: %d tables in %d FBGEMM TBEs", len(tables), len(groups))

    def prefetch(self, features: KeyedJaggedTensor) -> None:
        """Disk tables: start reading the rows ``features`` (the next batch) will look up into their caches
        while the current step computes (the training pipeline calls this); nothing for tables in RAM."""
        if self.fused_optimizer_config is None or not self.embedding_bags.has_disk_tables():
            return
        self.embedding_bags.prefetch_routed(
            self._router.route(features, weighted=self._is_weighted, counts=False)
        )

    def _init_dense(self) -> None:
        tables = self._embedding_bag_configs
        self.embedding_bags = dense_tables.dense_bags(tables, self._is_weighted, self._device)
        self._embedding_names = [n for names in get_embedding_names_by_table(tables) for n in names]
        self._lengths_per_embedding = [t.embedding_dim for t in tables for _ in t.feature_names]
        self._lookup = PooledLookupCall(self._pooled)
        self.reset_parameters()

    def _kernel_pooling(self, table: EmbeddingBagConfig) -> PoolingType:
        """Weighted MEAN runs as SUM in the kernel and is divided afterwards (see ``pooling``)."""
        if self._is_weighted and table.pooling is PoolingType.MEAN:
            return PoolingType.SUM
        return table.pooling

    def _divided_mean_spans(self, tables: Sequence[EmbeddingBagConfig]) -> list[tuple[int, int, int]]:
        """``(feature, first column, dim)`` within one kernel's output of each feature to divide by length."""
        spans, feature, col = [], 0, 0
        for table in tables:
            for _ in table.feature_names:
                if table.pooling is not self._kernel_pooling(table):
                    spans.append((feature, col, table.embedding_dim))
                feature, col = feature + 1, col + table.embedding_dim
        return spans

    @property
    def device(self) -> torch.device:
        if self.fused_optimizer_config is None:
            return dense_tables.device_of(self.embedding_bags, self._device)
        return self.embedding_bags.device

    @property
    def fused_optimizer(self) -> FusedEmbeddingOptimizer | None:
        """The optimizer that updates the tables during backward (its ``step()`` is a no-op); None when the
        collection was built without ``fused_optimizer=`` (its tables are the model optimizer's)."""
        if self.fused_optimizer_config is None:
            return None
        return self.embedding_bags.fused_optimizer

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return self._embedding_bag_configs

    def is_weighted(self) -> bool:
        return self._is_weighted

    def reset_parameters(self) -> None:
        """Give every table its initial values again (from ``init_seed``: the same values as at construction;
        each table's ``init_fn``, else uniform in [weight_init_min, weight_init_max])."""
        if self.fused_optimizer_config is None:
            dense_tables.reset_dense(self._embedding_bag_configs, self.embedding_bags, self.init_seed)
        else:
            self.embedding_bags.reset_parameters(self.init_seed)

    def forward(self, features: KeyedJaggedTensor) -> KeyedTensor:
        """Pooled embeddings ``[batch, sum of dims]`` of ``features``, keyed by embedding name.

        ``torch.fx`` records the FBGEMM lookup as one call; PT2 tracers (``torch.compile``/``export``) see
        it in plain PyTorch ops (``pt2_lookup``); TorchScript calls it back in Python (``lookup_call``).
        """
        values = self._lookup(features)
        return KeyedTensor(
            keys=self._embedding_names, length_per_key=self._lengths_per_embedding, values=values, key_dim=1
        )

    def _is_meta(self) -> bool:
        if self.fused_optimizer_config is None:
            return dense_tables.is_meta(self.embedding_bags)
        return self.embedding_bags.is_meta

    def _pooled(self, features: KJTLike) -> Tensor:
        if self._is_meta():
            values = torch.empty(features.stride(), sum(self._lengths_per_embedding), device="meta")
        elif self.fused_optimizer_config is None:
            values = dense_tables.dense_pooled(
                self.embedding_bags, self._embedding_bag_configs, features, self._is_weighted
            )
        elif torch.compiler.is_compiling():
            values = pt2_lookup.pooled(
                self.embedding_bags, self._embedding_bag_configs, features, self._is_weighted
            )
        else:
            values = _pooled_values(
                self.embedding_bags,
                self._router,
                features,
                self._is_weighted,
                self._mean_spans,
                self._columns,
            )
        return values


@torch.fx.wrap
def _pooled_values(
    tables: FusedTables,
    router: FeatureRouter,
    features: KJTLike,
    weighted: bool,
    mean_spans: list[list[tuple[int, int, int]]],
    columns: Tensor | None,
) -> Tensor:
    """``[batch, sum of dims]`` pooled through the FBGEMM TBEs, columns in table order."""
    inputs = router.route(features, weighted=weighted, counts=False)
    outputs = []
    for batch, item, spans in zip(tables.batches, inputs, mean_spans):
        pooled = batch(item.indices, item.offsets, item.per_sample_weights)
        if spans:
            lengths = item.offsets.diff().view(-1, item.batch_size)
            pooled = divide_by_bag_lengths(pooled, lengths, spans)
        outputs.append(pooled)
    values = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
    return values if columns is None else values.index_select(1, columns)
