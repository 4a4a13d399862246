"""Estimate the seconds each shard costs its rank per training iteration.

The model (all terms bytes / bandwidth; ``mem_bw`` is HBM on cuda and DDR on cpu):

- forward compute: ``lookups x cols x element bytes / mem_bw`` (reading the looked-up rows);
- input dist: ``id bytes / comm_bw`` (the ids all-to-all; none for data parallel, whose ids stay local);
- output dist: ``output bytes / comm_bw`` (pooled all-to-all for table/column wise, reduce-scatter of partial
  sums for row wise); table row wise reduce-scatters inside the host (``intra_host_bw``) and sends a
  ``1 / local_world_size`` part across hosts (``inter_host_bw``);
- backward compute: ``bwd_compute_multiplier x forward compute`` plus the optimizer touching rows: the fused
  kernel reads and writes ``min(rows, lookups)`` rows of weights and state, the dense kernel every row
  plus its gradient;
- backward comm: mirrors the output dist (output gradients travel back; ids have no gradient);
- data parallel adds the gradient all-reduce of the whole table, ``2 x bytes x (W - 1) / W / comm_bw``;
- every shard adds ``SHARD_OVERHEAD_SECONDS`` (kernel launches, collective latency), so splitting a table
  that gains nothing from it looks (slightly) worse than keeping it whole.

``comm_bw`` is the inter-host bandwidth once the world spans hosts, else the intra-host one. Every term is
non-decreasing in the pooling factor, the rows and the columns, so larger tables never look cheaper.
"""

from __future__ import annotations

from typing import Any

from rectrain.embedding.config import FusedOptimizerConfig
from rectrain.planner.sharding_option import Perf, ShardingOption
from rectrain.planner.storage import element_bytes
from rectrain.planner.topology import Topology
from rectrain.planner.types import FP32_BYTES, EmbeddingComputeKernel, Shard, ShardingType
from rectrain.planner.workload import shard_workload

SHARD_OVERHEAD_SECONDS = 10e-6


def estimate_perf(option: ShardingOption, topology: Topology, optimizer: FusedOptimizerConfig) -> list[float]:
    """Seconds per iteration of every shard of ``option`` on its rank, in shard order."""
    return [shard_perf(option, shard, topology, optimizer).total for shard in option.shards]


def shard_perf(
    option: ShardingOption, shard: Shard, topology: Topology, optimizer: FusedOptimizerConfig
) -> Perf:
    """The seconds of ``shard`` by stage (the per-shard overhead counts as forward compute)."""
    work = shard_workload(option, shard, topology)
    row_bytes = shard.num_cols * element_bytes(option)
    state_bytes = optimizer.state_floats_per_row(shard.num_cols) * FP32_BYTES
    fwd_compute = work.lookups * row_bytes / topology.mem_bw
    if option.compute_kernel == EmbeddingComputeKernel.FUSED:
        touched = min(shard.num_rows, work.lookups) * (row_bytes + state_bytes)
    else:
        touched = shard.num_rows * (row_bytes + state_bytes + shard.num_cols * FP32_BYTES)
    bwd_compute = topology.bwd_compute_multiplier * fwd_compute + 2 * touched / topology.mem_bw
    if option.sharding_type == ShardingType.DATA_PARALLEL:
        world = topology.world_size
        table_bytes = shard.num_rows * shard.num_cols * FP32_BYTES
        all_reduce = 2 * table_bytes * (world - 1) / world / topology.comm_bw
        return Perf(SHARD_OVERHEAD_SECONDS + fwd_compute, 0.0, bwd_compute, all_reduce)
    output_dist = _output_dist_seconds(option, work.output_bytes, topology)
    input_dist = work.id_bytes / topology.comm_bw
    return Perf(SHARD_OVERHEAD_SECONDS + fwd_compute, output_dist, bwd_compute, output_dist, 0.0, input_dist)


def _output_dist_seconds(option: ShardingOption, output_bytes: float, topology: Topology) -> float:
    if option.sharding_type != ShardingType.TABLE_ROW_WISE:
        return output_bytes / topology.comm_bw
    intra = output_bytes / (1000 * topology.intra_host_bw)  # the topology's bandwidths are bytes/ms
    inter = output_bytes / topology.local_world_size / (1000 * topology.inter_host_bw)
    return intra + inter


class EmbeddingPerfEstimator:
    """Sets ``shard.perf`` of every shard of the options to this model's :class:`Perf`, in milliseconds
    (TorchRec's ``ShardEstimator`` for perf, and its unit); ``fused_optimizer`` sizes the optimizer's work."""

    def __init__(
        self,
        topology: Topology,
        constraints: Any = None,
        is_inference: bool = False,
        fused_optimizer: FusedOptimizerConfig | None = None,
    ) -> None:
        self._topology = topology
        self._optimizer = fused_optimizer or FusedOptimizerConfig()

    def estimate(self, sharding_options: list[ShardingOption], sharder_data_map: Any = None) -> None:
        for option in sharding_options:
            for shard in option.shards:
                shard.perf = shard_perf(option, shard, self._topology, self._optimizer).scaled(1000)
