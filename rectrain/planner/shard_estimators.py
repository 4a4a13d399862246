"""TorchRec's per-shard storage estimate (``torchrec.distributed.planner.shard_estimators``), the planner's
other storage rule beside its measured one (``rectrain.planner.storage``).

:class:`EmbeddingStorageEstimator` gives every shard of every option the memory TorchRec's planner
documents for it, so numbers reported through TorchRec's API are TorchRec's:

    shard bytes = weights of the shard (table bytes x its share of the table's elements)
                + optimizer state   (weights x ``_get_optimizer_multipler``: SGD 0, Adam 2, row-wise Adagrad
                                     1 / dim, any other 1)
                + cache bookkeeping (UVM-cached kernels: ``rows x (4 + 16 x cache load factor)``)
                + one iteration's ids and outputs on the rank (``_calculate_shard_io_sizes``)

Where the bytes live follows the compute device and the kernel: on cuda in HBM (a UVM kernel keeps the
table in DDR; a cached one holds ``cache load factor`` of it in HBM), on cpu in DDR. Key-value (virtual)
tables keep at most their L1 cache in HBM. Data-parallel shards are whole copies of the table.

rectrain's own planner budgets a rank with its own estimate (``rectrain.planner.storage`` and
``rectrain.planner.memory``, measured on its kernels); this module is what TorchRec code calling the
enumerator API sees, and it estimates the planner's own options as well (they are the same records).
Kernels rectrain does not run (UVM, key-value) are estimated too, as planning numbers only: a plan that
uses one is refused (``EmbeddingComputeKernel.unsupported_reason``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from enum import Enum
from math import prod

import torch

from rectrain.embedding.config import FusedOptimizerConfig
from rectrain.planner.constraints import ParameterConstraints
from rectrain.planner.sharder_data import SharderData, StorageUsageType
from rectrain.planner.sharding_option import ShardingOption
from rectrain.planner.topology import Storage, Topology
from rectrain.planner.types import ID_BYTES, EmbeddingComputeKernel, ShardingType

BIGINT_DTYPE: int = ID_BYTES  # TorchRec's name
NUM_POOLINGS: float = 1.0  # poolings per example per feature when the constraints give none
UVM_CACHING_RATIO: float = 0.2  # share of a UVM-cached table's rows its HBM cache holds by default
KV_CACHING_RATIO: float = 0.2  # the same for key-value (virtual) tables

_K = EmbeddingComputeKernel
# Kernels that hold only part of the table on the compute device, behind a cache.
_CACHED = {k.value for k in (_K.FUSED_UVM_CACHING, _K.QUANT_UVM_CACHING, _K.KEY_VALUE)} | {
    k.value for k in (_K.SSD_VIRTUAL_TABLE, _K.DRAM_VIRTUAL_TABLE, _K.DRAM_SSD_VIRTUAL_TABLE)
}
_KEY_VALUE = {
    k.value for k in (_K.KEY_VALUE, _K.SSD_VIRTUAL_TABLE, _K.DRAM_VIRTUAL_TABLE, _K.DRAM_SSD_VIRTUAL_TABLE)
}
_UVM = {_K.FUSED_UVM.value, _K.FUSED_UVM_CACHING.value}
_DEVICE_MEMORY = {"cuda", "mtia"}  # compute devices whose working memory is HBM


class PipelineType(Enum):
    """TorchRec's training pipelines, as its planner's storage estimate distinguishes them."""

    NONE = "none"
    TRAIN_BASE = "train_base"
    TRAIN_SPARSE_DIST = "train_sparse_dist"
    TRAIN_PREFETCH_SPARSE_DIST = "train_prefetch_sparse_dist"


class EmbeddingStorageEstimator:
    """Sets ``shard.storage`` of every shard of the options (see the module doc for the formula).

    Args:
        topology: the world the options are for (its compute device and sizes).
        constraints: per-table constraints (batch sizes, poolings, virtual tables).
        pipeline_type: the training pipeline; pipelines keep more batches of ids in flight.
        run_embedding_at_peak_memory: count the lookup outputs as resident under a pipeline.
        is_inference: only the weights count (no optimizer state, no batches).
    """

    def __init__(
        self,
        topology: Topology,
        constraints: dict[str, ParameterConstraints] | None = None,
        pipeline_type: PipelineType = PipelineType.NONE,
        run_embedding_at_peak_memory: bool = False,
        is_inference: bool = False,
    ) -> None:
        self._topology = topology
        self._constraints = constraints
        self._pipeline_type = pipeline_type
        self._run_embedding_at_peak_memory = run_embedding_at_peak_memory
        self._is_inference = is_inference

    def estimate(
        self, sharding_options: list[ShardingOption], sharder_data_map: dict[str, SharderData] | None = None
    ) -> None:
        for option in sharding_options:
            sharder_data = (sharder_data_map or {}).get(option.module_type_key, SharderData())
            for shard, storage in zip(option.shards, self.storages(option, sharder_data)):
                shard.storage = storage

    def storages(
        self, option: ShardingOption, sharder_data: SharderData, optimizer: FusedOptimizerConfig | None = None
    ) -> list[Storage]:
        """The :class:`Storage` of every shard of ``option``; ``optimizer`` (default: the one the table's
        weight names, if any) sizes the optimizer state."""
        constraint = (self._constraints or {}).get(option.name)
        ratio = option.cache_load_factor or sharder_data.fused_params.get("cache_load_factor")
        return calculate_shard_storages(
            sharder_data=sharder_data,
            sharding_type=option.sharding_type,
            tensor=option.tensor,
            compute_device=self._topology.compute_device,
            compute_kernel=option.compute_kernel,
            shard_sizes=[shard.size for shard in option.shards],
            batch_sizes=option.batch_sizes
            or (constraint.batch_sizes if constraint and constraint.batch_sizes else None)
            or [option.batch_size] * option.num_inputs,
            world_size=self._topology.world_size,
            local_world_size=self._topology.intra_group_size,
            input_lengths=option.input_lengths,
            num_poolings=get_num_poolings(self._constraints, option),
            caching_ratio=ratio or UVM_CACHING_RATIO,
            is_pooled=option.is_pooled,
            input_data_type_size=BIGINT_DTYPE,
            output_data_type_size=_output_element_size(option),
            pipeline_type=self._pipeline_type,
            count_ephemeral_storage_cost=self._run_embedding_at_peak_memory,
            is_inference=self._is_inference,
            key_value_params=constraint.key_value_params if constraint else None,
            kv_cache_load_factor=sharder_data.fused_params.get("cache_load_factor", KV_CACHING_RATIO),
            use_virtual_table=constraint.use_virtual_table if constraint else False,
            optimizer=optimizer,
        )


def estimate_storage_torchrec(
    option: ShardingOption, topology: Topology, optimizer: FusedOptimizerConfig
) -> list[int]:
    """TorchRec's storage rule as the planner's ``storage_estimator`` (beside rectrain's own,
    ``storage.estimate_storage``): every shard's bytes in the memory ``topology`` bounds."""
    storages = EmbeddingStorageEstimator(topology).storages(option, SharderData(), optimizer)
    return [s.ddr if topology.compute_device == "cpu" else s.hbm for s in storages]


def _output_element_size(option: ShardingOption) -> float:
    dtype = option.output_dtype
    if dtype is None:
        return option.tensor.element_size()
    return dtype.bits / 8  # rectrain's DataType carries its width


def get_num_poolings(
    constraints: dict[str, ParameterConstraints] | None, option: ShardingOption
) -> list[float]:
    """Poolings per example of each feature: the option's own, else the constraints', else 1 each."""
    if option.num_poolings is not None and len(option.num_poolings) == len(option.input_lengths):
        return option.num_poolings
    constraint = (constraints or {}).get(option.name)
    if constraint and constraint.num_poolings:
        return constraint.num_poolings
    return [NUM_POOLINGS] * len(option.input_lengths)


def calculate_pipeline_io_cost(
    input_size: int,
    output_size: int,
    prefetch_size: int,
    pipeline_type: PipelineType,
    multipass_prefetch_max_pass: int | None,
    count_ephemeral_storage_cost: bool = False,
    is_inference: bool = False,
) -> int:
    """Bytes of ids and outputs resident for one shard: a sparse-dist pipeline keeps two batches of ids
    (the next one's input dist overlaps), a prefetching one three plus its prefetch burst; outputs count
    only when the lookups run at the memory peak. Without a pipeline: one batch of each."""
    if is_inference:
        return 0
    outputs = output_size if count_ephemeral_storage_cost else 0
    if pipeline_type == PipelineType.TRAIN_SPARSE_DIST:
        return 2 * input_size + outputs
    if pipeline_type == PipelineType.TRAIN_PREFETCH_SPARSE_DIST:
        burst = 1 + 6 / (multipass_prefetch_max_pass or 1)
        return 3 * input_size + int(burst * prefetch_size) + outputs
    return input_size + output_size


def calculate_shard_storages(
    sharder_data: SharderData,
    sharding_type: str,
    tensor: torch.Tensor,
    compute_device: str,
    compute_kernel: str,
    shard_sizes: list[list[int]],
    batch_sizes: list[int],
    world_size: int,
    local_world_size: int,
    input_lengths: list[float],
    num_poolings: list[float],
    caching_ratio: float,
    is_pooled: bool,
    input_data_type_size: float,
    output_data_type_size: float,
    pipeline_type: PipelineType = PipelineType.NONE,
    count_ephemeral_storage_cost: bool = False,
    is_inference: bool = False,
    multipass_prefetch_max_pass: int | None = None,
    key_value_params: object = None,
    kv_cache_load_factor: float = KV_CACHING_RATIO,
    use_virtual_table: bool = False,
    optimizer: FusedOptimizerConfig | None = None,
) -> list[Storage]:
    """The :class:`Storage` of every shard of ``tensor`` (see the module doc); ``optimizer`` sizes the
    optimizer state (default: the optimizer class the weight names, as TorchRec's)."""
    kernel, kind = str(compute_kernel), str(sharding_type)
    inputs, outputs = _calculate_shard_io_sizes(
        kind, batch_sizes, world_size, local_world_size, input_lengths, tensor.shape[1], shard_sizes,
        input_data_type_size, output_data_type_size, num_poolings, is_pooled,
    )  # fmt: skip
    table_bytes = tensor.numel() * tensor.element_size()
    in_ddr = (
        sharder_data.storage_usage_type == StorageUsageType.BASE and kernel in _UVM
    ) or compute_device == "cpu"
    hbm, ddr = (0, table_bytes) if in_ddr else (table_bytes, 0)
    cached = kernel in _CACHED
    if cached:
        hbm = round(ddr * caching_ratio)
    optimizer = optimizer or getattr(tensor, "_optimizer_classes", [None])[0]

    def specific(storage: int, clf: float | None) -> list[int]:
        return _calculate_storage_specific_sizes(
            storage, tensor.shape, shard_sizes, kind, optimizer, is_inference, clf
        )

    hbm_specific = specific(hbm, caching_ratio if cached else None)
    ddr_specific = specific(ddr, None)
    ssd_specific = [h + d for h, d in zip(hbm_specific, ddr_specific)]
    if kernel in _KEY_VALUE or use_virtual_table:
        # A key-value table keeps rows in host memory or SSD; HBM holds at most its L1 cache.
        l1_bytes = (getattr(key_value_params, "max_l1_cache_size", None) or 0) * 1024 * 1024
        cache_bytes = math.ceil(
            tensor.shape[0] * kv_cache_load_factor * tensor.element_size() * tensor.shape[1]
        )
        hbm_specific = [min(l1_bytes, cache_bytes)] * len(hbm_specific)
        ddr_specific = [0] * len(ddr_specific)
    on_device = compute_device in _DEVICE_MEMORY
    hbm_sizes = [
        h
        + calculate_pipeline_io_cost(
            i,
            o,
            i if cached else 0,
            pipeline_type,
            multipass_prefetch_max_pass,
            count_ephemeral_storage_cost,
            is_inference,
        )  # fmt: skip
        if on_device
        else 0
        for i, o, h in zip(inputs, outputs, hbm_specific)
    ]
    on_host = compute_device == "cpu" and not is_inference
    ddr_sizes = [i + o + d if on_host else d for i, o, d in zip(inputs, outputs, ddr_specific)]
    ssd_sizes = [s if kernel == _K.KEY_VALUE.value else 0 for s in ssd_specific]
    return [Storage(hbm=h, ddr=d, ssd=s) for h, d, s in zip(hbm_sizes, ddr_sizes, ssd_sizes)]


def _calculate_storage_specific_sizes(
    storage: int,
    shape: torch.Size,
    shard_sizes: list[list[int]],
    sharding_type: str,
    optimizer_class: type | None = None,
    is_inference: bool = False,
    clf: float | None = None,
) -> list[int]:
    """Weights + optimizer state + cache bookkeeping of every shard, from the table's ``storage`` bytes."""
    tensors = _calculate_tensor_sizes(storage, shape, shard_sizes, sharding_type)
    if is_inference:
        return tensors
    multiplier = _get_optimizer_multipler(optimizer_class, shape)
    optimizers = [math.ceil(t * multiplier) for t in tensors]
    caches = (
        [0] * len(shard_sizes) if clf is None else [math.ceil(s[0] * (4 + clf * 16)) for s in shard_sizes]
    )
    return [t + o + c for t, o, c in zip(tensors, optimizers, caches)]


def _calculate_tensor_sizes(
    storage: int, shape: torch.Size, shard_sizes: list[list[int]], sharding_type: str
) -> list[int]:
    """Every shard's share of ``storage`` by element count; a data-parallel shard is a whole copy."""
    if str(sharding_type) == ShardingType.DATA_PARALLEL.value:
        return [storage] * len(shard_sizes)
    return [math.ceil(storage * prod(size) / prod(shape)) for size in shard_sizes]


def _get_optimizer_multipler(optimizer_class: type | None, shape: torch.Size) -> float:
    """Optimizer-state bytes per weight byte for the table's in-backward optimizer (0 without one):
    the state rectrain's fused kernel keeps for it (SGD none, Adam two moments, Adagrad one value per
    weight, row-wise Adagrad one per row); an optimizer without a fused kernel counts one value per weight."""
    if not optimizer_class:
        return 0.0
    if isinstance(optimizer_class, FusedOptimizerConfig):
        return optimizer_class.state_floats_per_row(shape[-1]) / shape[-1]
    # Imported here: importing rectrain.distributed runs DMP's package, which plans with this module.
    from rectrain.distributed.parallel.fused_params import optimizer_type_of

    kind = optimizer_type_of(optimizer_class)
    if kind is None:
        return 1.0
    dim = shape[-1]
    return FusedOptimizerConfig(optimizer=kind).state_floats_per_row(dim) / dim


def _pooled_counts(
    batch_sizes: Sequence[int], input_lengths: Sequence[float], num_poolings: Sequence[float], is_pooled: bool
) -> tuple[float, float]:
    """Ids and output rows of one rank's batch: ``pooling factor x poolings x batch`` ids per feature; a
    pooled lookup outputs ``min(1, pooling factor)`` rows per example and pooling (a mostly empty feature
    outputs fewer), a sequence lookup one row per id."""
    ids = sum(
        length * pools * batch for length, pools, batch in zip(input_lengths, num_poolings, batch_sizes)
    )
    if not is_pooled:
        return ids, ids
    rows = sum(
        min(1.0, length) * pools * batch
        for length, pools, batch in zip(input_lengths, num_poolings, batch_sizes)
    )
    return ids, rows


def _calculate_shard_io_sizes(
    sharding_type: str,
    batch_sizes: list[int],
    world_size: int,
    local_world_size: int,
    input_lengths: list[float],
    emb_dim: int,
    shard_sizes: list[list[int]],
    input_data_type_size: float,
    output_data_type_size: float,
    num_poolings: list[float],
    is_pooled: bool,
) -> tuple[list[int], list[int]]:
    """``(id bytes, output bytes)`` of one iteration for every shard of a table sharded ``sharding_type``.

    A data-parallel replica looks up its own rank's batch; every other shard receives the ids of every
    rank's batch (``world_size`` senders) and outputs its columns of every rank's rows. Row blocks over
    ``parts`` ranks (row wise: the world, table row wise and grid: a host) each get ``1 / parts`` of the ids
    and output a partial row per example (to be reduce-scattered); an empty row block gets nothing.
    """
    kind = str(sharding_type)
    if kind not in {t.value for t in ShardingType}:
        raise ValueError(f"unrecognized or unsupported sharding type {sharding_type!r}")
    ids, rows = _pooled_counts(batch_sizes, input_lengths, num_poolings, is_pooled)
    senders = 1 if kind == ShardingType.DATA_PARALLEL.value else world_size
    parts = {"row_wise": world_size, "table_row_wise": local_world_size, "grid_shard": local_world_size}
    if kind in parts:
        ids /= parts[kind]
        rows = rows if is_pooled else ids
    inputs, outputs = [], []
    for size in shard_sizes:
        empty = kind in parts and not prod(size)
        inputs.append(0 if empty else math.ceil(ids * senders * input_data_type_size))
        outputs.append(0 if empty else math.ceil(rows * senders * size[1] * output_data_type_size))
    return inputs, outputs


# TorchRec's per-type entry points that its tests call by keyword, as cases of the one rule above.
def _calculate_dp_shard_io_sizes(
    batch_sizes: list[int], input_lengths: list[float], emb_dim: int, num_shards: int, **sizes: object
) -> tuple[list[int], list[int]]:
    return _calculate_shard_io_sizes(
        "data_parallel", batch_sizes, 1, 1, input_lengths, emb_dim, [[1, emb_dim]] * num_shards, **sizes
    )


def _calculate_tw_shard_io_sizes(
    batch_sizes: list[int], world_size: int, input_lengths: list[float], emb_dim: int, **sizes: object
) -> tuple[list[int], list[int]]:
    return _calculate_shard_io_sizes(
        "table_wise", batch_sizes, world_size, world_size, input_lengths, emb_dim, [[1, emb_dim]], **sizes
    )
