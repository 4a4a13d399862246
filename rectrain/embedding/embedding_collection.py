"""``EmbeddingCollection``: per-id (sequence) lookups through FBGEMM, as ``torchrec.EmbeddingCollection``.

Built as TorchRec builds it, each table is an ``nn.Embedding`` whose weight the user's optimizer steps
(``dense_tables``). Built with ``fused_optimizer=``: FBGEMM's sequence mode (``PoolingMode.NONE``) needs one
dim for all tables of a TBE, so tables are grouped by dim (and data type); each group is one TBE call with its
optimizer fused into backward.
"""

import logging

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
from torch import nn

from rectrain.embedding import dense_tables, init, pt2_lookup
from rectrain.embedding.config import EmbeddingConfig, FusedOptimizerConfig
from rectrain.embedding.feature_routing import FeatureRouter, KJTLike
from rectrain.embedding.fused_tables import FusedTables
from rectrain.embedding.layout import check_table_names, get_embedding_names_by_table, group_tables
from rectrain.embedding.lookup_call import SequenceLookupCall
from rectrain.errors import ConfigError
from rectrain.optim.fused import FusedEmbeddingOptimizer
from rectrain.sparse import JaggedTensor, KeyedJaggedTensor

logger = logging.getLogger(__name__)


class EmbeddingCollection(nn.Module):
    """Per-id embeddings of several features (``torchrec.EmbeddingCollection``).

    ``forward(kjt)`` returns ``{embedding name: JaggedTensor}`` with values ``[num ids, dim]`` and the
    feature's lengths; with ``need_indices=True`` the JaggedTensor's weights hold the ids (as TorchRec).
    Embedding names follow TorchRec (``"<feature>@<table>"`` for a feature read by several tables).
    Unlike TorchRec, tables may have different dims (each dim gets its own TBE).

    Args:
        tables: the tables; names must be unique.
        device: where the tables live and the kernels run (cpu or cuda), or ``meta`` (nothing allocated);
            default: torch's current default device.
        need_indices: also return each id alongside its embedding.
        fused_optimizer: the optimizer applied inside backward (FBGEMM kernels). Without it, as in TorchRec,
            ``embeddings.<table>`` is an ``nn.Embedding`` whose weight the model's optimizer updates.

    State dict keys are ``embeddings.<table>.weight``.
    """

    __jit_unused_properties__ = ["device", "fused_optimizer"]  # Python objects: not for TorchScript

    def __init__(
        self,
        tables: list[EmbeddingConfig],
        device: torch.device | str | None = None,
        *,
        need_indices: bool = False,
        fused_optimizer: FusedOptimizerConfig | None = None,
    ) -> None:
        super().__init__()
        self.fused_optimizer_config = fused_optimizer
        check_table_names(tables)
        for position, table in enumerate(tables):
            if not isinstance(table, EmbeddingConfig):
                raise ConfigError(
                    f"tables[{position}] must be an EmbeddingConfig, got {type(table).__name__}"
                )
        self._embedding_configs = list(tables)
        self._need_indices = need_indices
        self._device = torch.device(device) if device is not None else torch.empty(0).device
        self.init_seed = init.draw_seed()
        if fused_optimizer is None:
            self._init_dense()
            return
        groups = group_tables(
            self._embedding_configs, key=lambda t: (t.embedding_dim, t.data_type, t.storage)
        )
        self.embeddings = FusedTables(
            self._embedding_configs,
            groups,
            [PoolingMode.NONE] * len(groups),
            self.fused_optimizer_config,
            self._device,
            prefix="embeddings",
        )
        kernels = self.embeddings.group_tables
        self._router = FeatureRouter([[f for t in ts for f in t.feature_names] for ts in kernels])
        names = get_embedding_names_by_table(self._embedding_configs)
        by_table = {table.name: table_names for table, table_names in zip(tables, names)}
        # Output name of each TBE feature, in TBE order.
        self._group_names = [
            [name for table in tables for name in by_table[table.name]]
            for tables in self.embeddings.group_tables
        ]
        self._embedding_names = [name for table_names in names for name in table_names]
        self._lookup = SequenceLookupCall(self._sequences)
        self.reset_parameters()
        logger.debug("EmbeddingCollection: %d tables in %d FBGEMM TBEs", len(tables), len(groups))

    def prefetch(self, features: KeyedJaggedTensor) -> None:
        """Disk tables: start reading the rows ``features`` (the next batch) will look up into their caches
        while the current step computes (the training pipeline calls this); nothing for tables in RAM."""
        if self.fused_optimizer_config is None or not self.embeddings.has_disk_tables():
            return
        self.embeddings.prefetch_routed(self._router.route(features, weighted=False))

    def _init_dense(self) -> None:
        self.embeddings = dense_tables.dense_embeddings(self._embedding_configs, self._device)
        self._embedding_names = [n for names in self.embedding_names_by_table() for n in names]
        self._lookup = SequenceLookupCall(self._sequences)
        self.reset_parameters()

    @property
    def device(self) -> torch.device:
        if self.fused_optimizer_config is None:
            return dense_tables.device_of(self.embeddings, self._device)
        return self.embeddings.device

    @property
    def fused_optimizer(self) -> FusedEmbeddingOptimizer | None:
        """The optimizer that updates the tables during backward (its ``step()`` is a no-op); None when the
        collection was built without ``fused_optimizer=`` (its tables are the model optimizer's)."""
        if self.fused_optimizer_config is None:
            return None
        return self.embeddings.fused_optimizer

    def embedding_configs(self) -> list[EmbeddingConfig]:
        return self._embedding_configs

    def need_indices(self) -> bool:
        return self._need_indices

    def embedding_names_by_table(self) -> list[list[str]]:
        return get_embedding_names_by_table(self._embedding_configs)

    def reset_parameters(self) -> None:
        """Give every table its initial values again (from ``init_seed``, as at construction)."""
        if self.fused_optimizer_config is None:
            dense_tables.reset_dense(self._embedding_configs, self.embeddings, self.init_seed)
        else:
            self.embeddings.reset_parameters(self.init_seed)

    def forward(self, features: KeyedJaggedTensor) -> dict[str, JaggedTensor]:
        """``{embedding name: JaggedTensor}`` in table order, values ``[num ids, dim]``.

        ``torch.fx`` records the FBGEMM lookup as one call; PT2 tracers (``torch.compile``/``export``) see
        it in plain PyTorch ops (``pt2_lookup``); TorchScript calls it back in Python (``lookup_call``).
        """
        return self._lookup(features)

    def _sequences(self, features: KJTLike) -> dict[str, JaggedTensor]:
        if self.fused_optimizer_config is None:
            return dense_tables.dense_sequence(
                self.embeddings,
                self._embedding_configs,
                self.embedding_names_by_table(),
                features,
                self._need_indices,
            )
        if torch.compiler.is_compiling():
            return pt2_lookup.sequence(
                self.embeddings,
                self._embedding_configs,
                self.embedding_names_by_table(),
                features,
                self._need_indices,
            )
        return _sequence_embeddings(
            self.embeddings,
            self._router,
            features,
            self._group_names,
            self._embedding_names,
            self._need_indices,
        )


@torch.fx.wrap
def _sequence_embeddings(
    tables: FusedTables,
    router: FeatureRouter,
    features: KJTLike,
    group_names: list[list[str]],
    embedding_names: list[str],
    need_indices: bool,
) -> dict[str, JaggedTensor]:
    """``{embedding name: JaggedTensor}`` looked up through the FBGEMM TBEs."""
    inputs = router.route(features, weighted=False)
    out: dict[str, JaggedTensor] = {}
    for batch, item, names in zip(tables.batches, inputs, group_names):
        rows = batch(item.indices, item.offsets)
        lengths = item.offsets.diff()
        per_feature_lengths = lengths.split(item.batch_size) if item.batch_size else [lengths] * len(names)
        per_feature_rows = rows.split(item.values_per_feature)
        per_feature_ids = item.indices.split(item.values_per_feature)
        for name, values, feature_lengths, ids in zip(
            names, per_feature_rows, per_feature_lengths, per_feature_ids
        ):
            out[name] = JaggedTensor(
                values=values, weights=ids if need_indices else None, lengths=feature_lengths
            )
    return {name: out[name] for name in embedding_names}
