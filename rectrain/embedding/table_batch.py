"""One FBGEMM table-batched embedding (TBE) over a group of tables, with its optimizer fused into backward.

A ``FusedTableBatch`` is the unit every collection is built from: it owns the FBGEMM
``SplitTableBatchedEmbeddingBagsCodegen`` (weights and optimizer state live in its storage), exposes per-table
views of both, and translates FBGEMM's terse input errors into messages that name the feature.
The same code serves CPU (host memory, CPU kernels) and CUDA (device memory, CUDA kernels); the device picks.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType as FbgemmOptimType
from fbgemm_gpu.split_embedding_configs import SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
    BoundsCheckMode,
    EmbeddingLocation,
    PoolingMode,
)
from fbgemm_gpu.split_table_batched_embeddings_ops_training import (
    ComputeDevice,
    SplitTableBatchedEmbeddingBagsCodegen,
    WeightDecayMode,
)
from torch import Tensor

from rectrain.embedding import disk_tables
from rectrain.embedding.config import (
    BaseEmbeddingConfig,
    DataType,
    EmbOptimType,
    FusedOptimizerConfig,
    PoolingType,
)
from rectrain.embedding.cpu_adam import CpuAdamLookup
from rectrain.embedding.disk_cache import CachedTable, OutOfRange, RowCache, cache_slots
from rectrain.embedding.disk_tables import DiskBuffers
from rectrain.embedding.native_backward import NativeFusedLookup, use_native_backward
from rectrain.errors import ConfigError

logger = logging.getLogger(__name__)

_FBGEMM_OPTIMIZERS = {
    EmbOptimType.SGD: FbgemmOptimType.EXACT_SGD,
    EmbOptimType.ADAGRAD: FbgemmOptimType.EXACT_ADAGRAD,
    EmbOptimType.ROWWISE_ADAGRAD: FbgemmOptimType.EXACT_ROWWISE_ADAGRAD,
    EmbOptimType.ADAM: FbgemmOptimType.ADAM,
}
# FBGEMM names its state buffers momentum1/momentum2; Adam's are renamed to torch.optim's names.
_STATE_NAMES = {
    EmbOptimType.SGD: (),
    EmbOptimType.ADAGRAD: ("momentum1",),
    EmbOptimType.ROWWISE_ADAGRAD: ("momentum1",),
    EmbOptimType.ADAM: ("exp_avg", "exp_avg_sq"),
}
_TRAINING_PRECISIONS = {DataType.FP32: SparseType.FP32, DataType.FP16: SparseType.FP16}
_POOLING_MODES = {PoolingType.SUM: PoolingMode.SUM, PoolingType.MEAN: PoolingMode.MEAN}


def pooling_mode(pooling: PoolingType) -> PoolingMode:
    """FBGEMM's pooling mode for a pooled table (sequence tables use ``PoolingMode.NONE``)."""
    return _POOLING_MODES[pooling]


def _placement(device: torch.device) -> tuple[EmbeddingLocation, ComputeDevice]:
    if device.type == "cpu":
        return EmbeddingLocation.HOST, ComputeDevice.CPU
    if device.type == "cuda":
        return EmbeddingLocation.DEVICE, ComputeDevice.CUDA
    raise ConfigError(f"device must be cpu or cuda, got {device}")


def kernel_dim(dim: int) -> int:
    """The row width a table of ``dim`` columns gets inside the kernel: FBGEMM's batched kernels vectorise
    rows 4 floats at a time and assert on anything else, so narrower remainders are padded with zero columns
    that no output or state view shows."""
    return -(-dim // 4) * 4


def _precision(table: BaseEmbeddingConfig) -> SparseType:
    if table.data_type not in _TRAINING_PRECISIONS:
        names = ", ".join(d.value for d in _TRAINING_PRECISIONS)
        raise ConfigError(
            f"table {table.name!r}: data_type {table.data_type.value} cannot be trained; use one of {names} "
            "(quantized types are for serving)"
        )
    return _TRAINING_PRECISIONS[table.data_type]


class FusedTableBatch:
    """The tables of one group in one FBGEMM TBE, updated by the fused optimizer during backward.

    Input features are in TBE order: each table of the group in turn, its ``feature_names`` in order.
    ``indices``/``offsets`` follow FBGEMM's layout: ``offsets`` has ``num_features * batch + 1`` entries,
    feature-major, exactly like a KeyedJaggedTensor holding those features in that order.

    On CPU, FBGEMM 1.8.0 fuses only SGD and the two Adagrads; Adam there runs the project's sparse Adam from a
    custom autograd function (``CpuAdamLookup``) around FBGEMM's forward kernel.
    """

    def __init__(
        self,
        tables: Sequence[BaseEmbeddingConfig],
        pooling: PoolingMode,
        optimizer: FusedOptimizerConfig,
        device: torch.device,
    ) -> None:
        self.tables = list(tables)
        self.feature_names = [name for table in self.tables for name in table.feature_names]
        self.optimizer = optimizer.optimizer
        precisions = {_precision(table) for table in self.tables}
        assert len(precisions) == 1, "tables of one TBE must share a data_type (see group_tables)"
        precisions_used = next(iter(precisions))
        cpu_adam = optimizer.optimizer is EmbOptimType.ADAM and device.type == "cpu"
        location, compute_device = _placement(device)
        fbgemm_optimizer = FbgemmOptimType.EXACT_SGD if cpu_adam else _FBGEMM_OPTIMIZERS[optimizer.optimizer]
        self.disk = _disk_buffers(self.tables, device, fbgemm_optimizer, cpu_adam)
        # Disk tables: the TBE holds only each table's cache slots (rectrain.embedding.disk_cache); the
        # files behind it hold the rows.
        rows = (
            [t.num_embeddings for t in self.tables] if self.disk is None else _slots(self.tables, self.disk)
        )
        self.tbe = SplitTableBatchedEmbeddingBagsCodegen(
            [(n, kernel_dim(t.embedding_dim), location, compute_device) for n, t in zip(rows, self.tables)],
            feature_table_map=[i for i, t in enumerate(self.tables) for _ in t.feature_names],
            # The CPU Adam path updates weights itself; the TBE then only stores weights and runs forward.
            optimizer=fbgemm_optimizer,
            learning_rate=optimizer.lr,
            eps=optimizer.eps,
            beta1=optimizer.beta1,
            beta2=optimizer.beta2,
            weight_decay=optimizer.weight_decay,
            weight_decay_mode=WeightDecayMode.L2 if optimizer.weight_decay > 0 else WeightDecayMode.NONE,
            pooling_mode=pooling,
            device=device,
            # FATAL raises on CPU; on CUDA it is a device-side assert that kills the context, so there FBGEMM
            # instead replaces out-of-range ids by 0 and logs a warning.
            bounds_check_mode=BoundsCheckMode.FATAL if device.type == "cpu" else BoundsCheckMode.WARNING,
            weights_precision=precisions.pop(),
            output_dtype=SparseType.FP32,
            table_names=[t.name for t in self.tables],
        )
        if device.type == "cpu" and optimizer.weight_decay > 0 and not cpu_adam:
            # Measured on fbgemm-gpu-cpu 1.8: its CPU SGD, Adagrad and row-wise Adagrad updates are
            # bit-identical with and without weight_decay; say so rather than train silently without the
            # regularisation the config asks for (tests/embedding/test_cpu_weight_decay.py pins this).
            logger.warning(
                "weight decay %g is not applied: FBGEMM's CPU %s update ignores it (only sparse = 'adam' "
                "applies it on CPU); tables %s train without it",
                optimizer.weight_decay,
                optimizer.optimizer.value,
                [t.name for t in self.tables],
            )
        self._cpu_adam = CpuAdamLookup(self.tbe, optimizer) if cpu_adam else None
        native = not cpu_adam and use_native_backward(optimizer, device, precisions_used)
        self._native = NativeFusedLookup(self.tbe, optimizer) if native else None
        self._columns = _unpadded_columns(self.tables, pooling, device)
        self.cache = None if self.disk is None else self._row_cache(self.disk)
        logger.debug(
            "TBE over tables %s: optimizer %s, pooling %s, device %s",
            [t.name for t in self.tables],
            optimizer.optimizer.value,
            pooling.name,
            device,
        )

    def __call__(self, indices: Tensor, offsets: Tensor, per_sample_weights: Tensor | None = None) -> Tensor:
        """Pooled ``[batch, sum of feature dims]`` (or, unpooled, ``[num ids, dim]``) embeddings."""
        lookup_indices = indices
        if self.cache is not None:
            try:
                lookup_indices = self.cache.remap(indices, offsets, train=torch.is_grad_enabled())
            except OutOfRange:
                raise self._find_out_of_range_id(indices, offsets) or ValueError(
                    f"tables {[t.name for t in self.tables]}: an id is out of range"
                ) from None
        try:
            if torch.is_inference_mode_enabled():
                # FBGEMM's training lookup is registered only with an autograd kernel, which inference mode
                # skips; a no-grad lookup outside inference mode computes the same result.
                with torch.inference_mode(False), torch.no_grad():
                    return self._lookup(lookup_indices.clone(), offsets.clone(), _clone(per_sample_weights))
            return self._lookup(lookup_indices, offsets, per_sample_weights)
        except RuntimeError as error:
            out_of_range = self._find_out_of_range_id(indices, offsets)
            if out_of_range is not None:
                raise out_of_range from error
            raise

    def _lookup(self, indices: Tensor, offsets: Tensor, per_sample_weights: Tensor | None) -> Tensor:
        if self._cpu_adam is not None:
            out = self._cpu_adam(indices, offsets, per_sample_weights)
        elif self._native is not None and torch.is_grad_enabled():
            out = self._native(indices, offsets, per_sample_weights)
        else:
            out = self.tbe(indices, offsets, per_sample_weights)
        return out if self._columns is None else out.index_select(1, self._columns)

    def _find_out_of_range_id(self, indices: Tensor, offsets: Tensor) -> ValueError | None:
        """Name the first feature holding an id outside its table; only called after FBGEMM failed."""
        if offsets.numel() < 1 or (offsets.numel() - 1) % len(self.feature_names):
            return None
        batch = (offsets.numel() - 1) // len(self.feature_names)
        bounds = offsets[::batch].tolist() if batch else [0] * (len(self.feature_names) + 1)
        rows = [table.num_embeddings for table in self.tables for _ in table.feature_names]
        for feature, name in enumerate(self.feature_names):
            ids = indices[bounds[feature] : bounds[feature + 1]]
            bad = ids[(ids < 0) | (ids >= rows[feature])]
            if bad.numel():
                return ValueError(
                    f"feature {name!r}: id {int(bad[0])} is out of range for its table "
                    f"(num_embeddings={rows[feature]}); ids must lie in [0, {rows[feature]})"
                )
        return None

    def prefetch(self, indices: Tensor, offsets: Tensor) -> None:
        """Start reading the rows of the next batch (same layout as a call) into a disk table's cache while
        the current step computes; nothing to do for tables in RAM."""
        if self.cache is not None:
            self.cache.prefetch(indices, offsets)

    def flush(self) -> None:
        """Disk tables: write the cache's updated rows back and empty it, so the files hold the whole tables
        (before they are read or written whole: checkpoints, export, loading)."""
        if self.cache is not None:
            self.cache.flush()

    def table_weights(self) -> list[Tensor]:
        """Per-table ``[num_embeddings, embedding_dim]`` views of the TBE's weight storage (disk tables: of
        their files, after a ``flush``)."""
        if self.cache is not None:
            self.cache.flush()
            return [_unpad(c.backing["weights"], t) for c, t in zip(self.cache.tables, self.tables)]
        return [_unpad(w, t) for w, t in zip(self.tbe.split_embedding_weights(), self.tables)]

    def table_optimizer_states(self) -> list[dict[str, Tensor]]:
        """Per table, the optimizer state views by name (``momentum1``; Adam: ``exp_avg``, ``exp_avg_sq``,
        ``step``); disk tables: of their files, after a ``flush``."""
        if self.cache is not None:
            self.cache.flush()
            step = self._cpu_adam.table_states() if self._cpu_adam is not None else None
            return [
                {
                    **{
                        k: _unpad(v.view(c.rows, *self._state_shapes[i][k]), t)
                        for k, v in c.backing.items()
                        if k != "weights"
                    },
                    **({"step": step[i]["step"]} if step is not None else {}),
                }
                for i, (c, t) in enumerate(zip(self.cache.tables, self.tables))
            ]
        if self._cpu_adam is not None:
            states = self._cpu_adam.table_states()
            return [{k: _unpad(v, t) for k, v in s.items()} for s, t in zip(states, self.tables)]
        names = _STATE_NAMES[self.optimizer]
        if not names:
            return [{} for _ in self.tables]
        states = [
            {name: _unpad(state, table) for name, state in zip(names, per_table)}
            for per_table, table in zip(self.tbe.split_optimizer_states(), self.tables)
        ]
        if self.optimizer is EmbOptimType.ADAM:
            # FBGEMM keeps one step counter per TBE (its ``iter``), shared by every table of the batch.
            for state in states:
                state["step"] = self.tbe.iter
        return states

    def _cache_states(self) -> list[dict[str, Tensor]]:
        """Per table, the TBE's own (cache-sized) optimizer state by name."""
        if self._cpu_adam is not None:
            return [{k: v for k, v in s.items() if k != "step"} for s in self._cpu_adam.table_states()]
        names = _STATE_NAMES[self.optimizer]
        return (
            [dict(zip(names, per_table)) for per_table in self.tbe.split_optimizer_states()]
            if names
            else [{} for _ in self.tables]
        )

    def _row_cache(self, disk: DiskBuffers) -> RowCache:
        """The cache of the TBE's tables over ``disk``'s files: each buffer's per-table ``[slots, width]`` in
        the TBE and ``[rows, width]`` in its file (files laid out table after table)."""
        per_table = [
            {"weights": w, **s} for w, s in zip(self.tbe.split_embedding_weights(), self._cache_states())
        ]
        self._state_shapes = [{k: v.shape[1:] for k, v in d.items()} for d in per_table]
        starts = dict.fromkeys(per_table[0], 0) if per_table else {}
        tables = []
        for table, buffers in zip(self.tables, per_table):
            cache, backing = {}, {}
            for name, view in buffers.items():
                width = view.numel() // max(1, view.shape[0])
                count = table.num_embeddings * width
                backing[name] = disk[name][starts[name] : starts[name] + count].view(
                    table.num_embeddings, width
                )
                cache[name] = view.reshape(view.shape[0], width)
                assert cache[name].data_ptr() == view.data_ptr(), "a cache view must alias the TBE's storage"
                starts[name] += count
            tables.append(CachedTable(table.name, cache, backing))
        return RowCache(tables, [len(t.feature_names) for t in self.tables])

    def set_learning_rate(self, lr: float) -> None:
        """Change the learning rate the next backward uses."""
        if self._cpu_adam is not None:
            self._cpu_adam.lr = lr
        else:
            self.tbe.set_learning_rate(lr)

    def get_learning_rate(self) -> float:
        return self._cpu_adam.lr if self._cpu_adam is not None else self.tbe.get_learning_rate()


def _slots(tables: Sequence[BaseEmbeddingConfig], disk: DiskBuffers) -> list[int]:
    """Cache slots per disk table (``disk_cache.cache_slots``), from the bytes a row takes in the files:
    per-element buffers (weights, Adagrad, Adam) scale with the row's width, row-wise state does not."""
    rows = [t.num_embeddings for t in tables]
    row_bytes = [
        sum(
            b.element_size() * (kernel_dim(t.embedding_dim) if b.numel() != sum(rows) else 1)
            for b in disk.tensors().values()
        )
        for t in tables
    ]
    names = [t.name for t in tables]
    return cache_slots(rows, row_bytes, names, disk.cache_bytes, disk_tables.settings().table_cache_bytes)


def _disk_buffers(
    tables: Sequence[BaseEmbeddingConfig],
    device: torch.device,
    fbgemm_optimizer: FbgemmOptimType,
    cpu_adam: bool,
) -> DiskBuffers | None:
    """Mapped files for the weight and optimizer-state buffers of a TBE over disk tables (None: RAM tables).

    Sizes are FBGEMM's host split sizes (``construct_split_state``): rows x kernel width per table, one value
    per row for row-wise state; FBGEMM checks them when it takes the buffers."""
    kinds = {t.storage for t in tables}
    assert len(kinds) == 1, "tables of one TBE must share a storage (see the collections' group keys)"
    if kinds.pop() != "disk":
        return None
    names = [t.name for t in tables]
    if device.type != "cpu":
        raise ConfigError(f"tables {names}: storage 'disk' runs on CPU only; these are built on {device}")
    elements = sum(t.num_embeddings * kernel_dim(t.embedding_dim) for t in tables)
    rows = sum(t.num_embeddings for t in tables)
    dtype = torch.float16 if tables[0].data_type is DataType.FP16 else torch.float32
    sizes = {"weights": (elements, dtype)}
    if fbgemm_optimizer is FbgemmOptimType.EXACT_ROWWISE_ADAGRAD:
        sizes["momentum1"] = (rows, torch.float32)
    elif fbgemm_optimizer is FbgemmOptimType.EXACT_ADAGRAD:
        sizes["momentum1"] = (elements, torch.float32)
    if cpu_adam:
        sizes["exp_avg"] = sizes["exp_avg_sq"] = (elements, dtype)
    return DiskBuffers("+".join(names), sizes)


def _unpad(tensor: Tensor, table: BaseEmbeddingConfig) -> Tensor:
    """A per-element ``[rows, kernel dim]`` view cut to the table's own columns (others pass through)."""
    dim = table.embedding_dim
    if tensor.dim() == 2 and tensor.shape[1] == kernel_dim(dim) != dim:
        return tensor[:, :dim]
    return tensor


def _unpadded_columns(
    tables: Sequence[BaseEmbeddingConfig], pooling: PoolingMode, device: torch.device
) -> Tensor | None:
    """The kernel output columns that are the tables' own (None when no table is padded).

    Pooled output is every feature's kernel-width block side by side; sequence output one row per id."""
    if all(kernel_dim(t.embedding_dim) == t.embedding_dim for t in tables):
        return None
    if pooling is PoolingMode.NONE:
        dim = tables[0].embedding_dim  # sequence tables of one kernel share their dim
        return torch.arange(dim, device=device)
    columns, start = [], 0
    for table in tables:
        for _ in table.feature_names:
            columns.extend(range(start, start + table.embedding_dim))
            start += kernel_dim(table.embedding_dim)
    return torch.tensor(columns, dtype=torch.int64, device=device)


def _clone(tensor: Tensor | None) -> Tensor | None:
    return None if tensor is None else tensor.clone()
