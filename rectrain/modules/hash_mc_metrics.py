"""Metrics of a multi-probe ZCH table (``torchrec.modules.hash_mc_metrics``).

A ``HashZchManagedCollisionModule`` built with ``name=`` and ``tb_logging_frequency=N`` feeds every remap
to a ``ScalarLogger``, which counts hits (the id owned its row), inserts (it claimed a free row), collisions
(neither: it fell back to another id's row), evictions, opt-ins and the age of evicted ids, and every N
steps reports the rates through a backend (the log by default) and starts counting afresh. Only the shard
holding bucket 0 reports, so a sharded table reports once.

This implementation sits at TorchRec's path itself (not re-exported from ``rectrain.zch``): code that
patches this module's ``logging`` or ``time`` reaches it here.
"""

import abc
import logging
import time

import torch
from torch import Tensor

from rectrain.zch.hash_evictions import HashZchEvictionConfig

logger = logging.getLogger(__name__)


class ScalarLoggerBackend(abc.ABC):
    """Where ``ScalarLogger`` reports: subclass for TensorBoard, a metrics service, ..."""

    @abc.abstractmethod
    def report(
        self, log_message: str, name: str, run_type: str, step: int, rate_metrics: dict[str, float]
    ) -> None:
        """One report: a formatted line and the rates (hit_rate, insert_rate, collision_rate, eviction_rate,
        opt_in_rate, avg_eviction_age, table_usage_ratio) of table ``name`` at ``step``."""


class ConsoleScalarLoggerBackend(ScalarLoggerBackend):
    """Reports through Python logging (this module's logger), also to ``log_file_path`` when given."""

    def __init__(self, log_file_path: str = "") -> None:
        self._logger: logging.Logger = logging.getLogger(__name__)
        if log_file_path != "":
            self._logger.addHandler(logging.FileHandler(log_file_path, mode="w"))

    def report(
        self, log_message: str, name: str, run_type: str, step: int, rate_metrics: dict[str, float]
    ) -> None:
        self._logger.info(log_message)


def _count(mask: Tensor) -> int:
    return int(torch.sum(mask).item())


class ScalarLogger(torch.nn.Module):
    """Counts a ZCH table's lookups and reports their rates every ``frequency`` steps.

    Args:
        name: the table.
        zch_size: rows of this shard.
        frequency: steps between reports.
        start_bucket: this shard's first bucket (only bucket 0's shard reports).
        num_buckets_per_rank: buckets of this shard (a divisor of ``zch_size``).
        num_reserved_slots_per_bucket: reserved rows at each bucket's end (opt-in), or <= 0.
        device: where the counters' tensors live.
        disable_fallback: the table drops misses (hits are then ids found anywhere among the values).
        log_file_path: for the default backend: also log to this file.
        backend: where to report (default ``ConsoleScalarLoggerBackend``).
    """

    STEPS_BUFFER: str = "_scalar_logger_steps"
    SECONDS_IN_HOUR: int = 3600
    MAX_HOURS: int = 2**31 - 1

    def __init__(
        self,
        name: str,
        zch_size: int,
        frequency: int,
        start_bucket: int,
        num_buckets_per_rank: int,
        num_reserved_slots_per_bucket: int,
        device: torch.device,
        disable_fallback: bool,
        log_file_path: str = "",
        backend: ScalarLoggerBackend | None = None,
    ) -> None:
        super().__init__()
        if zch_size % num_buckets_per_rank != 0:
            raise ValueError(
                f"zch_size {zch_size} must be divisible by num_buckets_per_rank {num_buckets_per_rank}"
            )
        self.register_buffer(self.STEPS_BUFFER, torch.tensor(1, dtype=torch.int64), persistent=False)
        self._name = name
        self._zch_size = zch_size
        self._frequency = frequency
        self._start_bucket = start_bucket
        self._num_buckets_per_rank = num_buckets_per_rank
        self._num_reserved_slots_per_bucket = num_reserved_slots_per_bucket
        self._device = device
        self._disable_fallback = disable_fallback
        bucket_rows = zch_size // num_buckets_per_rank
        bucket_ends = (
            torch.arange(1, num_buckets_per_rank + 1, dtype=torch.int64, device=device) * bucket_rows
        )
        # Rows below a bucket's reserved tail are the opted-in ones.
        self._opt_in_ranges: Tensor = bucket_ends - max(num_reserved_slots_per_bucket, 0)
        self._dtype_checked = False
        self._reset_counters()
        self._backend: ScalarLoggerBackend = (
            backend if backend is not None else ConsoleScalarLoggerBackend(log_file_path=log_file_path)
        )

    def _reset_counters(self) -> None:
        self._total_cnt = 0
        self._hit_cnt = 0
        self._insert_cnt = 0
        self._collision_cnt = 0
        self._eviction_cnt = 0
        self._opt_in_cnt = 0
        self._sum_eviction_age = 0.0

    def should_report(self) -> bool:
        return (
            self._start_bucket == 0
            and self._total_cnt > 0
            and bool(self._scalar_logger_steps % self._frequency == 0)
        )

    def update(
        self,
        identities_0: Tensor,
        identities_1: Tensor,
        values: Tensor,
        remapped_ids: Tensor,
        hit_indices: Tensor,
        evicted_emb_indices: Tensor | None,
        metadata: Tensor | None,
        eviction_config: HashZchEvictionConfig | None = None,
    ) -> None:
        """Count one feature's remap: the table before (``identities_0``) and after, the ids and rows."""
        if not self._dtype_checked:
            assert identities_0.dtype == values.dtype, "the identities and the ids must have one dtype"
            self._dtype_checked = True
        owner_before = torch.index_select(identities_0, 0, remapped_ids)[:, 0]
        owner_after = torch.index_select(identities_1, 0, remapped_ids)[:, 0]
        inserts = _count(owner_before == -1) - _count(owner_after == -1)
        # Without fallback a miss is dropped, so a hit is any id found; with it, only the id's own row.
        hits = _count(torch.isin(owner_before, values) if self._disable_fallback else owner_before == values)
        self._insert_cnt += inserts
        self._total_cnt += values.numel()
        self._hit_cnt += hits
        self._collision_cnt += values.numel() - hits - inserts
        bucket_of = (values[hit_indices] if self._disable_fallback else values) % self._num_buckets_per_rank
        self._opt_in_cnt += _count(remapped_ids < self._opt_in_ranges.index_select(0, bucket_of))
        if evicted_emb_indices is not None and evicted_emb_indices.numel() > 0:
            self._count_evictions(torch.unique(evicted_emb_indices), metadata, eviction_config)

    def _count_evictions(
        self, evicted: Tensor, metadata: Tensor | None, eviction_config: HashZchEvictionConfig | None
    ) -> None:
        self._eviction_cnt += evicted.numel()
        assert metadata is not None, "metadata cannot be None when rows were evicted"
        hour = int(time.time()) / self.SECONDS_IN_HOUR % self.MAX_HOURS
        if eviction_config is not None and eviction_config.single_ttl is not None:
            # The metadata holds each row's expiry hour: now + ttl - expiry is how long it had lived.
            ages = hour + eviction_config.single_ttl - metadata[evicted, 0]
            self._sum_eviction_age += int(torch.sum(ages).item())

    def _rates(self, identities: Tensor) -> dict[str, float]:
        total = self._total_cnt
        unused = _count(identities[:, 0] == -1)
        return {
            "hit_rate": round(self._hit_cnt / total, 3),
            "insert_rate": round(self._insert_cnt / total, 3),
            "collision_rate": round(self._collision_cnt / total, 3),
            "eviction_rate": round(self._eviction_cnt / total, 3),
            "opt_in_rate": round(self._opt_in_cnt / total, 3),
            "avg_eviction_age": round(self._sum_eviction_age / self._eviction_cnt, 3)
            if self._eviction_cnt
            else 0,
            "table_usage_ratio": round((self._zch_size - unused) / self._zch_size, 3),
        }

    def forward(self, run_type: str, identities: Tensor) -> None:
        """End of a step: report if due (then start counting afresh)."""
        if self.should_report():
            rates = self._rates(identities)
            message = (
                f"ZCH table {self._name} ({run_type}): {self._total_cnt} ids, {self._hit_cnt} hits, "
                f"{self._insert_cnt} inserts, {self._collision_cnt} collisions, "
                f"{self._eviction_cnt} evictions, "
                f"{self._opt_in_cnt} opted in; " + ", ".join(f"{k}={v}" for k, v in rates.items())
            )
            step = int(self._scalar_logger_steps.item())
            self._backend.report(
                log_message=message, name=self._name, run_type=run_type, step=step, rate_metrics=rates
            )
            self._reset_counters()
        self._scalar_logger_steps += 1
