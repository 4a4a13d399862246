"""``QuantEmbeddingBagCollection``: pooled lookups of quantized tables placed over serving devices.

Each serving device runs one FBGEMM ``IntNBitTableBatchedEmbeddingBagsCodegen`` per pooling mode holding the
table shards placed there (int8/int4/int2/fp16/fp32 rows may mix in one kernel). A KJT is routed once into
per-kernel inputs; ids of a row-wise shard are filtered to its row range and re-based. The kernel outputs are
gathered on the output device and put in table order; partial sums of a split table are added (its MEAN
pooling is done as SUM and divided by the whole bag length afterwards). Rows changed by model deltas since the
package are served from a per-kernel overlay (``overlays_with`` prepares, ``use_overlays`` swaps in; see
``overlay``): a kernel with changed rows reads them in place beside its mapped base rows (its ids remapped),
the others read their rows as they are.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import torch
from fbgemm_gpu.split_embedding_configs import SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
    BoundsCheckMode,
    EmbeddingLocation,
    PoolingMode,
)
from fbgemm_gpu.split_table_batched_embeddings_ops_inference import IntNBitTableBatchedEmbeddingBagsCodegen
from torch import Tensor, nn

from recserve.errors import PackageError
from recserve.runtime.layout import QuantizedTable
from recserve.runtime.overlay import KernelLayout, RowOverlay
from recserve.runtime.placement import ServingPlacement, TableShard
from rectrain.embedding import EmbeddingBagConfig, PoolingType
from rectrain.embedding.feature_routing import FeatureRouter, KJTLike, TBEInput, feature_positions
from rectrain.embedding.layout import get_embedding_names_by_table
from rectrain.embedding.pooling import divide_by_bag_lengths
from rectrain.sparse import KeyedTensor

logger = logging.getLogger(__name__)

_OUTPUT_TYPES = {
    torch.float32: SparseType.FP32,
    torch.float16: SparseType.FP16,
    torch.bfloat16: SparseType.BF16,
}
_Piece = tuple[TableShard, EmbeddingBagConfig, QuantizedTable]  # a shard, its table, its rows


def physical_device(logical: str, default: torch.device) -> torch.device:
    """The torch device a logical serving device runs on.

    Logical ``cpu:N`` devices all run on the host; a device of another type than ``default`` (a cuda package
    loaded on cpu, or the reverse) runs on ``default``.
    """
    device = torch.device(logical)
    if device.type != default.type:
        return default
    return torch.device("cpu") if device.type == "cpu" else device


@dataclass(frozen=True)
class _Slot:
    """One feature of one shard inside a kernel, and where its pooled output goes."""

    feature: str
    column: int  # first output column of its embedding (table order)
    dim: int
    row_start: int
    row_end: int


class _ShardLookup:
    """One FBGEMM int-N TBE over the shards that one device serves with one pooling mode."""

    def __init__(
        self,
        shards: Sequence[_Piece],
        slots: list[_Slot],
        pooling: PoolingMode,
        device: torch.device,
        output_dtype: torch.dtype,
        bounds_check: bool,
        remaps: Mapping[TableShard, Tensor],
    ) -> None:
        self.device = device
        self.slots = slots
        location = EmbeddingLocation.HOST if device.type == "cpu" else EmbeddingLocation.DEVICE
        # A pruned shard stores fewer rows than it has ids: the kernel remaps each id to its stored row
        remapping = [remaps.get(s) for s, _, _ in shards]
        self.pruned = any(r is not None for r in remapping)
        self.tbe = IntNBitTableBatchedEmbeddingBagsCodegen(
            [
                (s.label, q.num_embeddings, c.embedding_dim, q.dtype.sparse_type, location)
                for s, c, q in shards
            ],
            feature_table_map=[i for i, (_, config, _) in enumerate(shards) for _ in config.feature_names],
            pooling_mode=pooling,
            device=device,
            output_dtype=_OUTPUT_TYPES[output_dtype],
            bounds_check_mode=BoundsCheckMode.FATAL if bounds_check else BoundsCheckMode.NONE,
            index_remapping=remapping if self.pruned else None,
        )
        if self.pruned:
            _remap_per_feature(self.tbe, remapping, device)
        if not _share_rows(self.tbe, [q for _, _, q in shards], device):
            self.tbe.initialize_weights()
            self.tbe.assign_embedding_weights([(q.weights, q.scale_bias) for _, _, q in shards])
        self.partial = any(s.row_start > 0 or s.row_end < c.num_embeddings for s, c, _ in shards)
        self._lo = torch.tensor([slot.row_start for slot in slots], dtype=torch.int64)
        self._hi = torch.tensor([slot.row_end for slot in slots], dtype=torch.int64)
        self.shards = [s for s, _, _ in shards]  # the kernel's tables, in its order
        self.overlay: RowOverlay | None = None  # rows changed by deltas since the base (see ``overlay``)

    @property
    def features(self) -> list[str]:
        return [slot.feature for slot in self.slots]

    def __call__(self, item: TBEInput) -> Tensor:
        indices, offsets, weights = item.indices, item.offsets, item.per_sample_weights
        if self.partial:
            indices, offsets, weights = self._keep_own_rows(item)
        if self.device.type != "cpu":
            indices = indices.to(self.device, non_blocking=True)
            offsets = offsets.to(self.device, non_blocking=True)
            weights = None if weights is None else weights.to(self.device, non_blocking=True)
        if self.overlay is not None:
            return self.overlay.lookup(self.tbe, indices, offsets, weights)
        return self.tbe(indices, offsets, weights)

    def with_rows(self, rows: Mapping[str, tuple[Tensor, Tensor]]) -> RowOverlay | None:
        """The overlay this kernel would have with ``rows`` (table -> sorted global ids, kernel rows) on top
        of its current one; nothing changes until it is assigned to ``overlay``."""
        if self.pruned and any(shard.table in rows for shard in self.shards):
            raise PackageError(
                f"tables {sorted({s.table for s in self.shards if s.table in rows})}: a pruned package takes "
                "no deltas (its kernels store only the kept rows); follow training with unpruned bases"
            )
        changes = {}
        for index, shard in enumerate(self.shards):
            if shard.table not in rows:
                continue
            ids, kernel_rows = rows[shard.table]
            bounds = torch.tensor([shard.row_start, shard.row_end], dtype=ids.dtype)
            lo, hi = torch.searchsorted(ids, bounds).tolist()
            if lo < hi:
                local = (ids[lo:hi] - shard.row_start).to(self.device)
                changes[index] = (local, kernel_rows[lo:hi].to(self.device))
        if not changes:
            return self.overlay
        base = self.overlay if self.overlay is not None else RowOverlay.empty(KernelLayout.of(self.tbe))
        return base.merged(changes, f"kernel {[s.label for s in self.shards]}")

    def _keep_own_rows(self, item: TBEInput) -> tuple[Tensor, Tensor, Tensor | None]:
        """Drop the ids outside each slot's row range, re-base the rest to the shard's first row."""
        device = item.indices.device  # the request's (CPU), or a GPU's where the batch was staged there
        counts = torch.tensor(item.values_per_feature, dtype=torch.int64, device=device)
        lo = self._lo.to(device).repeat_interleave(counts, output_size=item.indices.numel())
        hi = self._hi.to(device).repeat_interleave(counts, output_size=item.indices.numel())
        ids = item.indices.long()
        keep = (ids >= lo) & (ids < hi)
        kept_before = torch.cat([keep.new_zeros(1, dtype=torch.int64), keep.cumsum(0)])
        weights = None if item.per_sample_weights is None else item.per_sample_weights[keep]
        return (ids - lo)[keep], kept_before[item.offsets.long()], weights


def _remap_per_feature(
    tbe: IntNBitTableBatchedEmbeddingBagsCodegen, remapping: list[Tensor | None], device: torch.device
) -> None:
    """Lay the kernel's remap out per feature rather than per table.

    FBGEMM's ``pruned_array_lookup`` finds an id's remap by the id's bag (``T = len(offsets) - 1`` regions,
    ``B = bags / T``): one region per *feature*. The kernel lays the regions out per table, which is the same
    only when no table is read by two features; so a table read by several features gets its remap once per
    feature (a region of length 0 passes ids through unchanged, for a table that is not pruned).
    """
    per_feature = [remapping[t] for t in tbe.feature_table_map]
    lengths = [0 if r is None else r.numel() for r in per_feature]
    tbe.index_remappings_array_offsets = torch.tensor([0, *lengths], device=device).cumsum(0)
    tbe.index_remappings_array = torch.cat([r for r in per_feature if r is not None]).to(device, torch.int32)


def _share_rows(
    tbe: IntNBitTableBatchedEmbeddingBagsCodegen, tables: list[QuantizedTable], device: torch.device
) -> bool:
    """Point a CPU kernel at the tables' own kernel rows instead of copying them; whether it could.

    It can when every table's rows are views of one buffer (a package file mapped by ``load_shards``): the
    kernel reads row ``r`` of table ``t`` at ``weights_offsets[t] + r * row bytes`` of one host buffer, so
    that buffer is the mapped file and the offsets are where each shard's rows lie in it. On a GPU, or for
    tables built in memory, the caller copies (``assign_embedding_weights``).
    """
    views = [q.rows_view for q in tables]
    if device.type != "cpu" or any(v is None or not v.is_contiguous() for v in views):
        return False
    storage = views[0].untyped_storage()
    if any(v.untyped_storage().data_ptr() != storage.data_ptr() for v in views):
        return False
    flat = torch.empty(0, dtype=torch.uint8).set_(storage, 0, (storage.nbytes(),), (1,))
    tbe.weights_host = flat
    tbe.host_size = flat.numel()
    tbe.weights_physical_offsets = [v.data_ptr() - storage.data_ptr() for v in views]
    tbe.weight_initialized = True
    tbe.initialize_logical_weights_placements_and_offsets()
    return True


class QuantEmbeddingBagCollection(nn.Module):
    """Drop-in for ``EmbeddingBagCollection`` at serving time (``torchrec.quant.EmbeddingBagCollection``).

    ``forward(kjt)`` returns the same ``KeyedTensor`` (keys, order, widths) as the training collection would,
    on ``output_device`` in ``output_dtype``. Holds no parameters: the weights live in the FBGEMM kernels.

    Args:
        tables: the table configs, in the training collection's order.
        shards: the rows of each shard of ``placement`` in serving layout (copied into the kernels).
        placement: which device serves which rows of each table.
        is_weighted: pool ``sum(weight * row)`` with ``kjt.weights()``.
        device: the physical device the logical devices of ``placement`` map to (see ``physical_device``),
            also the output device.
        output_dtype: float32, float16 or bfloat16.
        bounds_check: let FBGEMM check ids (callers that validate ids themselves turn it off).
        remaps: the index remap of each pruned shard (``pruning``): its stored row per id, -1 for none.
    """

    def __init__(
        self,
        tables: Sequence[EmbeddingBagConfig],
        shards: Mapping[TableShard, QuantizedTable],
        placement: ServingPlacement,
        *,
        is_weighted: bool = False,
        device: torch.device | str = "cpu",
        output_dtype: torch.dtype = torch.float32,
        bounds_check: bool = True,
        remaps: Mapping[TableShard, Tensor] | None = None,
    ) -> None:
        super().__init__()
        self._configs = list(tables)
        self._is_weighted = is_weighted
        self._device = torch.device(device)
        names = get_embedding_names_by_table(self._configs)
        self._embedding_names = [name for table_names in names for name in table_names]
        self._lengths_per_embedding = [t.embedding_dim for t in self._configs for _ in t.feature_names]
        self._lookups = self._build_lookups(
            names, shards, placement, output_dtype, bounds_check, remaps or {}
        )
        self._router = FeatureRouter([lookup.features for lookup in self._lookups])
        self._target = torch.cat(
            [torch.arange(s.column, s.column + s.dim) for lookup in self._lookups for s in lookup.slots]
        ).to(self._device)
        self._mode = _assembly_mode(self._target)
        if self._mode == "select":
            self._target = torch.argsort(self._target)
        self._mean_spans = self._divided_spans(placement)
        self._one_kernel = self._is_one_kernel()  # fixed by the layout: found once, read per batch
        self._span_positions: dict[tuple[str, ...], list[int]] = {}

    def _build_lookups(
        self,
        names: list[list[str]],
        pieces: Mapping[TableShard, QuantizedTable],
        placement: ServingPlacement,
        output_dtype: torch.dtype,
        bounds_check: bool,
        remaps: Mapping[TableShard, Tensor],
    ) -> list[_ShardLookup]:
        columns = torch.tensor([0, *self._lengths_per_embedding]).cumsum(0).tolist()
        first_embedding = torch.tensor([0, *[len(n) for n in names]]).cumsum(0).tolist()
        by_name = {config.name: index for index, config in enumerate(self._configs)}
        groups: dict[
            tuple[str, PoolingMode], list[tuple[TableShard, EmbeddingBagConfig, QuantizedTable]]
        ] = {}
        for shard in placement.shards:
            config = self._configs[by_name[shard.table]]
            pooling = self._kernel_pooling(config, placement.is_split(config.name))
            groups.setdefault((shard.device, pooling), []).append((shard, config, pieces[shard]))
        lookups = []
        for (logical, pooling), shards in groups.items():
            slots = [
                _Slot(feature, columns[first_embedding[by_name[c.name]] + k], c.embedding_dim, *s.rows)
                for s, c, _ in shards
                for k, feature in enumerate(c.feature_names)
            ]
            device = physical_device(logical, self._device)
            lookups.append(_ShardLookup(shards, slots, pooling, device, output_dtype, bounds_check, remaps))
            logger.debug("lookup on %s (%s): %d shards", logical, pooling.name, len(shards))
        return lookups

    def _kernel_pooling(self, table: EmbeddingBagConfig, split: bool) -> PoolingMode:
        """MEAN of a split table, or weighted MEAN, runs as SUM and is divided afterwards."""
        if table.pooling is PoolingType.MEAN and not split and not self._is_weighted:
            return PoolingMode.MEAN
        return PoolingMode.SUM

    def _divided_spans(self, placement: ServingPlacement) -> list[tuple[str, int, int]]:
        """``(feature, first column, dim)`` of every embedding pooled as SUM that must be MEAN."""
        spans, column = [], 0
        for table in self._configs:
            for feature in table.feature_names:
                split = placement.is_split(table.name)
                if (
                    table.pooling is PoolingType.MEAN
                    and self._kernel_pooling(table, split) is PoolingMode.SUM
                ):
                    spans.append((feature, column, table.embedding_dim))
                column += table.embedding_dim
        return spans

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def feature_order(self) -> list[str]:
        """The features the lookups read, in the order the kernels take them."""
        return list(self._router.features)

    def single_kernel(self) -> nn.Module | None:
        """The one FBGEMM module every lookup runs in, when its output is the collection's output as is
        (one device and pooling mode, whole tables, no re-ordered columns, no MEAN to divide); else None."""
        return self._lookups[0].tbe if self._one_kernel else None

    def _is_one_kernel(self) -> bool:
        if len(self._lookups) != 1 or self._mode != "identity" or self._mean_spans:
            return False
        lookup = self._lookups[0]
        return not lookup.partial and lookup.device == self._device

    def single_kernel_inputs(self, features: KJTLike) -> tuple[Tensor, Tensor, Tensor | None] | None:
        """``(indices, offsets, per_sample_weights)`` for ``single_kernel()`` when ``features`` feed it as
        they are (keys in the kernel's feature order, values and offsets of one dtype, no changed rows over
        its base rows); else None."""
        if not self._one_kernel or self._lookups[0].overlay is not None:
            return None
        if list(features.keys()) != self._router.features or features.variable_stride_per_key():
            return None
        values, offsets = features.values(), features.offsets()
        if values.dtype != offsets.dtype:
            return None
        if not self._is_weighted:
            return values, offsets, None
        weights = features.weights_or_none()
        if weights is None or weights.dtype != torch.float32:
            return None
        return values, offsets, weights

    def overlays_with(self, rows: Mapping[str, tuple[Tensor, Tensor]]) -> list[RowOverlay | None]:
        """Every kernel's overlay with ``rows`` (table -> sorted global ids int64 [n], kernel rows uint8
        [n, row bytes]) on top of the current ones, prepared without changing anything (``use_overlays``)."""
        return [lookup.with_rows(rows) for lookup in self._lookups]

    def use_overlays(self, overlays: Sequence[RowOverlay | None]) -> list[RowOverlay | None]:
        """Serve the changed rows of ``overlays`` (from ``overlays_with``) from the next batch on; returns
        the replaced ones (for the caller to free off the batch path)."""
        assert len(overlays) == len(self._lookups), "one overlay (or None) per kernel"
        replaced = [lookup.overlay for lookup in self._lookups]
        for lookup, overlay in zip(self._lookups, overlays):
            if overlay is not None and overlay is not lookup.overlay:
                overlay.activate()
            lookup.overlay = overlay
        return replaced

    @property
    def overlay_bytes(self) -> int:
        """Memory held by changed rows (and their keys) over the shared base rows."""
        return sum(lookup.overlay.nbytes for lookup in self._lookups if lookup.overlay is not None)

    def embedding_bag_configs(self) -> list[EmbeddingBagConfig]:
        return self._configs

    def is_weighted(self) -> bool:
        return self._is_weighted

    def forward(self, features: KJTLike) -> KeyedTensor:
        """Pooled embeddings ``[batch, sum of dims]`` of ``features``, keyed by embedding name."""
        inputs = self._router.route(features, weighted=self._is_weighted)
        outputs = [lookup(item).to(self._device) for lookup, item in zip(self._lookups, inputs)]
        flat = outputs[0] if len(outputs) == 1 else torch.cat(outputs, dim=1)
        if self._mode == "select":
            values = flat.index_select(1, self._target)
        elif self._mode == "add":
            values = flat.new_zeros(flat.shape[0], sum(self._lengths_per_embedding))
            values.index_add_(1, self._target, flat)
        else:
            values = flat
        if self._mean_spans:
            values = self._divide_means(values, features)
        return KeyedTensor(
            keys=self._embedding_names, length_per_key=self._lengths_per_embedding, values=values, key_dim=1
        )

    def _divide_means(self, values: Tensor, features: KJTLike) -> Tensor:
        keys = tuple(features.keys())
        if keys not in self._span_positions:
            self._span_positions[keys] = feature_positions(keys, [f for f, _, _ in self._mean_spans])
        lengths = features.offsets().diff().view(len(keys), -1).to(self._device)
        spans = [(p, col, dim) for p, (_, col, dim) in zip(self._span_positions[keys], self._mean_spans)]
        return divide_by_bag_lengths(values, lengths, spans)


def split_by_placement(
    tables: Mapping[str, QuantizedTable], placement: ServingPlacement
) -> dict[TableShard, QuantizedTable]:
    """The rows of every shard of ``placement`` cut from whole ``tables`` (views)."""
    return {shard: tables[shard.table].rows(*shard.rows) for shard in placement.shards}


def _assembly_mode(target: Tensor) -> str:
    """How kernel output columns become table-order columns: as they are, permuted, or added up."""
    if torch.equal(target, torch.arange(target.numel(), device=target.device)):
        return "identity"
    if torch.unique(target).numel() == target.numel():
        return "select"
    return "add"
