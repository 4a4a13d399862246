"""``ManagedCollisionCollection``: one remapper per table over a KeyedJaggedTensor (``torchrec``'s MCC).

``forward(kjt)`` keeps the features of the configured tables (in table order, other keys dropped), hands
each table's features to its ``ManagedCollisionModule`` as one ``JaggedTensor`` (its ``weights`` carry the
id count of each feature, which per-feature policies read) and returns a KeyedJaggedTensor of rows with the
input's lengths, weights and strides.
"""

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from rectrain.embedding.config import BaseEmbeddingConfig
from rectrain.sparse import JaggedTensor, KeyedJaggedTensor
from rectrain.zch.module import ManagedCollisionModule


@torch.fx.wrap
def _in_table_order(
    features: KeyedJaggedTensor, feature_names: list[str], order: list[int], ordered: list[bool]
) -> KeyedJaggedTensor:
    """``features`` permuted to ``feature_names`` (extra keys dropped).

    The permutation is computed on the first call and kept in ``order`` (left empty when the input already
    is in that order); lists, updated in place, so a traced or scripted graph keeps the cache.
    """
    if not ordered or not ordered[0]:
        keys = features.keys()
        for name in feature_names:
            order.append(keys.index(name))
        if order == list(range(len(keys))):
            order.clear()
        if len(ordered) > 0:
            ordered[0] = True
        else:
            ordered.append(True)
    if len(order) > 0:
        features = features.permute(order)
    return features


@torch.fx.wrap
def _ids_per_feature(kjt: KeyedJaggedTensor) -> Tensor:
    return torch.tensor(kjt.length_per_key())


@torch.fx.wrap
def _merge(base: dict[str, JaggedTensor] | None, update: dict[str, JaggedTensor]) -> dict[str, JaggedTensor]:
    merged: dict[str, JaggedTensor] = {}
    if base is not None:
        for name, jt in base.items():
            merged[name] = jt
    for name, jt in update.items():
        merged[name] = jt
    return merged


@torch.fx.wrap
def _cat_values(tables: dict[str, JaggedTensor]) -> Tensor:
    return torch.cat([jt.values() for jt in tables.values()])


@torch.fx.wrap
def _cat_lengths(tables: dict[str, JaggedTensor]) -> Tensor:
    return torch.cat([jt.lengths() for jt in tables.values()])


def _like(features: KeyedJaggedTensor, values: Tensor, lengths: Tensor) -> KeyedJaggedTensor:
    """``features`` (keys, weights, strides, inverse indices) with other values and lengths."""
    return KeyedJaggedTensor(
        keys=features.keys(),
        values=values,
        lengths=lengths,
        weights=features.weights_or_none(),
        stride=features.stride(),
        stride_per_key=features.stride_per_key(),
        stride_per_key_per_rank=features._stride_per_key_per_rank,
        inverse_indices=features.inverse_indices_or_none(),
    )


def _check_modules(
    modules: dict[str, ManagedCollisionModule], configs: Sequence[BaseEmbeddingConfig]
) -> None:
    names = [config.name for config in configs]
    for config in configs:
        if config.name not in modules:
            raise ValueError(f"table {config.name!r} has no module in managed_collision_modules")
        if modules[config.name].output_size() != config.num_embeddings:
            raise ValueError(
                f"table {config.name!r}: its managed collision module maps into "
                f"{modules[config.name].output_size()} rows; the table has "
                f"num_embeddings={config.num_embeddings}"
            )
    extra = sorted(set(modules) - set(names))
    if extra:
        raise ValueError(f"managed_collision_modules {extra} have no table in embedding_configs {names}")


class ManagedCollisionCollection(nn.Module):
    """Remaps the features of several tables, each through its own managed collision module.

    Args:
        managed_collision_modules: table name -> module; every table of ``embedding_configs`` needs one
            whose ``output_size()`` is the table's ``num_embeddings``.
        embedding_configs: the tables (their ``feature_names`` say which features each module remaps).
        need_preprocess: kept for TorchRec's sharded modules (whether inputs are preprocessed before
            the input distribution).
    """

    # Class-level annotations: TorchScript cannot infer the type of an empty list attribute.
    _table_to_features: dict[str, list[str]]
    _features_order: list[int]
    _created_feature_order: list[bool]

    def __init__(
        self,
        managed_collision_modules: dict[str, ManagedCollisionModule],
        embedding_configs: Sequence[BaseEmbeddingConfig],
        need_preprocess: bool = True,
    ) -> None:
        super().__init__()
        _check_modules(managed_collision_modules, embedding_configs)
        # In table order, the order of the features' split (TorchScript can iterate a ModuleDict, not
        # index it by a variable).
        self._managed_collision_modules = nn.ModuleDict(
            {config.name: managed_collision_modules[config.name] for config in embedding_configs}
        )
        self._embedding_configs = embedding_configs
        self.need_preprocess = need_preprocess
        self._feature_to_table: dict[str, str] = {
            feature: config.name for config in embedding_configs for feature in config.feature_names
        }
        self._table_to_features: dict[str, list[str]] = {
            config.name: config.feature_names for config in embedding_configs
        }
        self._table_feature_splits: list[int] = [len(config.feature_names) for config in embedding_configs]
        self._table_name_to_config: dict[str, BaseEmbeddingConfig] = {
            config.name: config for config in embedding_configs
        }
        self._feature_names: list[str] = [f for config in embedding_configs for f in config.feature_names]
        self._created_feature_order: list[bool] = [False]
        self._features_order: list[int] = []

    def embedding_configs(self) -> Sequence[BaseEmbeddingConfig]:
        return self._embedding_configs

    def table_to_number_buckets(self) -> dict[str, int]:
        return {table: module.buckets() for table, module in self._managed_collision_modules.items()}

    def forward(self, features: KeyedJaggedTensor, mutate_miss_lengths: bool = True) -> KeyedJaggedTensor:
        features = _in_table_order(
            features, self._feature_names, self._features_order, self._created_feature_order
        )
        per_table = features.split(self._table_feature_splits)
        remapped: dict[str, JaggedTensor] | None = None
        for i, (table, module) in enumerate(self._managed_collision_modules.items()):
            kjt = per_table[i]
            jt = JaggedTensor(values=kjt.values(), lengths=kjt.lengths(), weights=_ids_per_feature(kjt))
            remapped = _merge(remapped, module({table: jt}, mutate_miss_lengths=mutate_miss_lengths))
        assert remapped is not None  # at least one table (TorchScript needs the refinement)
        return _like(features, _cat_values(remapped), _cat_lengths(remapped))

    def evict(self) -> dict[str, Tensor | None]:
        """Each table's rows handed to new ids since the last call (None: none)."""
        return {table: module.evict() for table, module in self._managed_collision_modules.items()}

    def open_slots(self) -> dict[str, Tensor]:
        return {table: module.open_slots() for table, module in self._managed_collision_modules.items()}

    def lookup_runtime_meta(
        self, features: KeyedJaggedTensor, remapped_ids: KeyedJaggedTensor
    ) -> KeyedJaggedTensor:
        """The runtime metadata (e.g. id frequency) each remapper keeps for the rows of ``remapped_ids``."""
        raw = features.split(self._table_feature_splits)
        rows = remapped_ids.split(self._table_feature_splits)
        metas: list[Tensor] = []
        for i, (_table, module) in enumerate(self._managed_collision_modules.items()):
            metas.append(module.lookup_runtime_meta(raw[i].values(), rows[i].values()).reshape(-1))
        return _like(features, torch.cat(metas, dim=0), features.lengths())

    def lookup_custom_runtime_meta(self, remapped_ids: KeyedJaggedTensor) -> Tensor:
        """The custom per-row metadata of the rows of ``remapped_ids``, tables stacked."""
        rows = remapped_ids.split(self._table_feature_splits)
        metas: list[Tensor] = []
        for i, (_table, module) in enumerate(self._managed_collision_modules.items()):
            metas.append(module.lookup_custom_runtime_meta(rows[i].values()))
        return torch.cat(metas, dim=0)
