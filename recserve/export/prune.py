"""Pruning at export: which rows of each table ship, and the remap that serves the ids of the others.

Policies (``recserve export --prune POLICY``), each applied to every table on its own:

- ``count:N``: keep the rows training looked up at least N times (the checkpoint's row counts).
- ``top:F``: keep the fraction F (0 < F <= 1) of the rows looked up most (ties: the lower id).
- ``norm:F``: keep the fraction F of the rows with the largest L2 norm (for weights without row counts,
  e.g. imported from TorchRec: rows training never moved keep their small initial values).

A pruned id serves (``--prune-default``) ``zero``: no row (the kernel's remap gives it -1, so it adds nothing
to its bag; a MEAN bag still counts it), or ``mean``: one extra stored row per shard, the fp32 mean of the
table's pruned rows, quantized like any row. The package layout is ``recserve.runtime.pruning``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from recserve.errors import ExportError
from recserve.export.accuracy import AccuracySample, synthetic_sample
from recserve.export.quantize import quantize_table
from recserve.export.writer import PackageWriter
from recserve.runtime.layout import TableDType, kernel_rows
from recserve.runtime.placement import TableShard
from recserve.runtime.pruning import DEFAULTS, REMAP_FILE
from rectrain.models.config import ModelConfig
from rectrain.sparse import KeyedJaggedTensor

POLICIES = ("count", "top", "norm")
SLICE_BYTES = 64 * 2**20  # fp32 rows read at once, as the exporter's slices
_USAGE = "expected count:N (rows seen >= N times), top:F or norm:F (keep a fraction 0 < F <= 1)"


@dataclass(frozen=True)
class PrunePolicy:
    """A parsed ``--prune`` value and the vector pruned ids serve (``default``: zero or mean)."""

    kind: str
    value: float
    default: str = "zero"

    @classmethod
    def parse(cls, text: str, default: str = "zero") -> PrunePolicy:
        """ExportError (one line, naming the option) unless ``text`` is one of the policies."""
        if default not in DEFAULTS:
            raise ExportError(f"--prune-default {default!r}: expected one of {list(DEFAULTS)}")
        kind, sep, number = str(text).partition(":")
        if not sep or kind not in POLICIES:
            raise ExportError(f"--prune {text!r}: {_USAGE}")
        try:
            value = float(number)
        except ValueError:
            raise ExportError(f"--prune {text!r}: {number!r} is not a number; {_USAGE}") from None
        if kind == "count" and not (value >= 1 and value == int(value)):
            raise ExportError(f"--prune {text!r}: count:N needs a whole number N >= 1")
        if kind != "count" and not 0 < value <= 1:
            raise ExportError(f"--prune {text!r}: {kind}:F needs a fraction 0 < F <= 1")
        return cls(kind, int(value) if kind == "count" else value, default)

    @property
    def needs_counts(self) -> bool:
        return self.kind != "norm"

    def __str__(self) -> str:
        return f"{self.kind}:{self.value:g}"

    def keep(self, scores: Tensor) -> Tensor:
        """Which rows to keep (bool ``[rows]``) given each row's score (its count, or its norm)."""
        if self.kind == "count":
            return scores >= self.value
        rows = scores.numel()
        kept = min(rows, math.ceil(self.value * rows))
        order = torch.sort(scores.double(), descending=True, stable=True).indices[:kept]
        mask = torch.zeros(rows, dtype=torch.bool)
        mask[order] = True
        return mask


@dataclass
class PrunedTable:
    """The rows one table keeps (``keep``, bool ``[rows]``), what pruned ids serve, and, while it streams,
    the sum of its pruned fp32 rows (for the ``mean`` default)."""

    keep: Tensor
    default: str
    scores: str  # "row counts" or "row norms": what the policy ranked
    pruned_sum: Tensor | None = None
    pruned_rows: int = 0

    @property
    def kept(self) -> int:
        return int(self.keep.sum())

    def stored_rows(self, shard: TableShard) -> int:
        """The rows the package stores for ``shard``: its kept rows, plus the default row (``mean``)."""
        kept = int(self.keep[shard.row_start : shard.row_end].sum())
        return kept + (1 if self.default == "mean" else 0)

    def remap(self, shard: TableShard) -> Tensor:
        """int32 ``[shard rows]``: each id's stored row in the shard, or the default row (-1 for zero)."""
        keep = self.keep[shard.row_start : shard.row_end]
        kept = int(keep.sum())
        position = keep.to(torch.int32).cumsum(0, dtype=torch.int32) - 1
        fill = kept if self.default == "mean" else -1
        return torch.where(keep, position, torch.tensor(fill, dtype=torch.int32))

    def add_pruned(self, rows: Tensor) -> None:
        """Account fp32 rows this table prunes (the ``mean`` default is their mean)."""
        if self.default != "mean" or rows.shape[0] == 0:
            return
        total = rows.double().sum(0)
        self.pruned_sum = total if self.pruned_sum is None else self.pruned_sum + total
        self.pruned_rows += rows.shape[0]

    def default_row(self, dim: int) -> Tensor:
        """The fp32 vector a pruned id serves: zeros, or the mean of the pruned rows (zeros if none)."""
        if self.default == "zero" or self.pruned_sum is None:
            return torch.zeros(dim)
        return (self.pruned_sum / self.pruned_rows).float()

    def summary(self) -> dict[str, Any]:
        return {"rows": self.keep.numel(), "kept": self.kept, "scores": self.scores}


def traffic_sample(
    cfg: ModelConfig, counts: Mapping[str, Tensor], num_examples: int = 4096, seed: int = 0
) -> AccuracySample:
    """The accuracy sample for a count-pruned export without held-out data: shaped as ``synthetic_sample``,
    but each feature's ids drawn in proportion to its table's training lookups (``counts``), so the gate
    sees the traffic the counts describe rather than uniform ids, which would hit mostly pruned rows."""
    base = synthetic_sample(cfg, num_examples, seed=seed)
    kjt = base.kjt
    gen = torch.Generator().manual_seed(seed + 1)
    table_of = {f: t.name for t in cfg.tables for f in t.feature_names}
    values = []
    for key, ids in zip(kjt.keys(), kjt.values().split(kjt.length_per_key())):
        weights = counts.get(table_of.get(key, ""))
        if weights is None or ids.numel() == 0 or int(weights.sum()) == 0:
            values.append(ids)
            continue
        values.append(torch.multinomial(weights.double(), ids.numel(), replacement=True, generator=gen))
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=kjt.keys(), values=torch.cat(values), lengths=kjt.lengths()
    )
    return AccuracySample(base.dense, kjt)


def table_scores(
    policy: PrunePolicy, tables: Any, key: str, name: str, rows: int, dim: int
) -> tuple[Tensor, str]:
    """Each row's score for ``policy``: its training lookups, or its L2 norm (read a slice at a time)."""
    if policy.needs_counts:
        counts = tables.counts(key)
        if counts is None:
            raise ExportError(
                f"--prune {policy}: table {name!r} has no row counts (saved without train.row_counts, from a "
                "data-parallel table, or imported from TorchRec); prune it by norm:F"
            )
        return counts, "row counts"
    norms = torch.empty(rows)
    step = max(1, SLICE_BYTES // (4 * dim))
    for start in range(0, rows, step):
        end = min(rows, start + step)
        norms[start:end] = tables.rows(key, start, end).detach().to("cpu", torch.float32).norm(dim=1)
    return norms, "row norms"


def plan_pruning(
    policy: PrunePolicy, cfg: ModelConfig, tables: Any, keys: Mapping[str, str]
) -> dict[str, PrunedTable]:
    """Every table's ``PrunedTable`` under ``policy`` (``keys``: table name -> its state-dict key)."""
    pruned = {}
    for table in cfg.tables:
        scores, kind = table_scores(
            policy, tables, keys[table.name], table.name, table.num_embeddings, table.embedding_dim
        )
        pruned[table.name] = PrunedTable(policy.keep(scores), policy.default, kind)
    return pruned


def stream_pruned_table(
    writer: PackageWriter,
    tables: Any,
    key: str,
    table: Any,
    dtype: TableDType,
    shards: list[TableShard],
    pruned: PrunedTable,
    sample_rows: Tensor,
) -> tuple[Tensor, Tensor]:
    """Write a pruned table's kept rows (a slice at a time), its default rows and remaps; returns the fp32
    rows ``sample_rows`` as trained and as the package serves them (pruned ones replaced by the default)."""
    dim = table.embedding_dim
    compact = torch.zeros(max(1, sample_rows.numel()), dim)
    written = dict.fromkeys(shards, 0)
    step = max(1, SLICE_BYTES // (4 * dim))
    for start in range(0, table.num_embeddings, step):
        end = min(table.num_embeddings, start + step)
        weight = tables.rows(key, start, end).detach().to("cpu", torch.float32)
        keep = pruned.keep[start:end]
        pruned.add_pruned(weight[~keep])
        quantized = quantize_table(weight[keep], dtype)
        rows = kernel_rows(quantized.weights, quantized.scale_bias)
        first = torch.cat([torch.zeros(1, dtype=torch.long), keep.long().cumsum(0)])  # kept before each row
        for shard in shards:
            lo, hi = max(start, shard.row_start), min(end, shard.row_end)
            if lo < hi and first[hi - start] > first[lo - start]:
                part = rows[first[lo - start] : first[hi - start]]
                writer.write_shard_rows(shard, written[shard], part)
                written[shard] += part.shape[0]
        inside = ((sample_rows >= start) & (sample_rows < end)).nonzero().squeeze(1)
        compact[inside] = weight[sample_rows[inside] - start]
    default = pruned.default_row(dim)
    if pruned.default == "mean":
        quantized = quantize_table(default.unsqueeze(0), dtype)
        for shard in shards:
            writer.write_shard_rows(
                shard, written[shard], kernel_rows(quantized.weights, quantized.scale_bias)
            )
    for shard in shards:
        writer.write_remap(shard, pruned.remap(shard))
    served = compact.clone()
    if sample_rows.numel():
        served[~pruned.keep[sample_rows]] = default
    return compact, served


def pruning_record(
    policy: PrunePolicy, pruned: Mapping[str, PrunedTable], stored: Mapping[TableShard, int], report: dict
) -> dict[str, Any]:
    """The manifest's ``pruning`` section: policy, default, rows kept per table, rows stored per shard, and
    the accuracy gate's AUC drop of the pruned+quantized package (beside the unpruned one of its dtype)."""
    return {
        "policy": str(policy),
        "default": policy.default,
        "remap_file": REMAP_FILE,
        "tables": {name: table.summary() for name, table in pruned.items()},
        "shards": {shard.label: rows for shard, rows in stored.items()},
        "auc_drop": -report["package"]["auc_diff"],
    }
