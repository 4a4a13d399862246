"""The tables of one collection: FBGEMM TBEs, per-table weight parameters aliasing them, fused optimizer."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
from torch import Tensor, nn

from rectrain.embedding import init
from rectrain.embedding.config import BaseEmbeddingConfig, DataType, FusedOptimizerConfig
from rectrain.embedding.table_batch import FusedTableBatch
from rectrain.optim.fused import FusedEmbeddingOptimizer


class TableWeight(nn.Module):
    """One table's weight: a Parameter that aliases the TBE storage, so ``state_dict`` reads the kernel's
    weights and ``load_state_dict`` writes into them. It never gets a ``.grad``: the update is fused."""

    def __init__(self, weight: Tensor) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight, requires_grad=False)


class FusedTables(nn.ModuleDict):
    """``{table name: TableWeight}`` backed by one FBGEMM TBE per group of tables.

    Registered by the collections as ``embedding_bags`` / ``embeddings`` so that state-dict keys are
    TorchRec's (``embedding_bags.<table>.weight``). The TBEs are deliberately not sub-modules: their own
    buffers (optimizer state, offsets) would otherwise leak into the model's state dict. The optimizer state
    is checkpointed through ``fused_optimizer`` instead.

    On the meta device nothing is allocated: the weights are meta tensors and there are no kernels (TorchRec's
    way of describing a model too large for one process; ``DistributedModelParallel`` then builds only this
    rank's shards). Moving with ``.to(device)`` / ``.to_empty(device=...)`` rebuilds the kernels on the new
    device and carries weights and optimizer state over; casting to another dtype raises. ``copy.deepcopy``
    works (the aliases are re-pointed at the copied TBEs).

    Args:
        tables: all tables of the collection, in order.
        groups: indices into ``tables``, one list per TBE.
        poolings: FBGEMM pooling mode of each group.
        optimizer: the fused optimizer every TBE runs.
        device: where weights live and kernels run (cpu, cuda or meta).
        prefix: the collection's attribute name, used for the optimizer's parameter keys.
    """

    __jit_unused_properties__ = ["device", "is_meta"]  # not for TorchScript

    def __init__(
        self,
        tables: Sequence[BaseEmbeddingConfig],
        groups: Sequence[Sequence[int]],
        poolings: Sequence[PoolingMode],
        optimizer: FusedOptimizerConfig,
        device: torch.device,
        prefix: str,
    ) -> None:
        super().__init__()
        self.tables = list(tables)
        self.group_tables = [[self.tables[i] for i in group] for group in groups]
        self._poolings = list(poolings)
        self._optimizer_config = optimizer
        self._prefix = prefix
        self._device = torch.device(device)
        self.batches = self._build_batches()
        views = self._weight_views()
        for table in self.tables:
            self[table.name] = TableWeight(views[table.name])
        self.fused_optimizer = self._make_optimizer(optimizer.lr)

    @property
    def device(self) -> torch.device:
        return self._device

    @property
    def is_meta(self) -> bool:
        """Whether the tables are only described (meta device): no storage, no kernels."""
        return self._device.type == "meta"

    def _build_batches(self) -> list[FusedTableBatch]:
        if self.is_meta:
            return []
        return [
            FusedTableBatch(tables, pooling, self._optimizer_config, self._device)
            for tables, pooling in zip(self.group_tables, self._poolings)
        ]

    def _make_optimizer(self, lr: float) -> FusedEmbeddingOptimizer:
        optimizer = FusedEmbeddingOptimizer(
            {self._param_key(t.name): self[t.name].weight for t in self.tables},
            self._optimizer_state,
            self.batches,
            dataclasses.replace(self._optimizer_config, lr=lr),
        )
        for table in self.tables:
            # TorchRec's mark of a table updated in backward: in_backward_optimizer_filter leaves it out of
            # the optimizers built from model.named_parameters().
            self[table.name].weight._in_backward_optimizers = [optimizer]
        return optimizer

    def _param_key(self, table: str) -> str:
        return f"{self._prefix}.{table}.weight"

    def _weight_views(self) -> dict[str, Tensor]:
        if self.is_meta:
            return {
                t.name: torch.empty(t.num_embeddings, t.embedding_dim, dtype=_dtype(t), device="meta")
                for t in self.tables
            }
        return {
            table.name: view
            for batch in self.batches
            for table, view in zip(batch.tables, batch.table_weights())
        }

    def table_optimizer_states(self) -> dict[str, dict[str, Tensor]]:
        """``{table name: {state name: view}}`` of the fused optimizer's state (``momentum1``; Adam:
        ``exp_avg``, ``exp_avg_sq``, ``step``): views of the kernel storage; copying into them restores it.
        Empty on the meta device."""
        return {
            table.name: states
            for batch in self.batches
            for table, states in zip(batch.tables, batch.table_optimizer_states())
        }

    def _optimizer_state(self) -> dict[str, dict[str, Tensor]]:
        return {
            self._param_key(table): {f"{table}.{name}": tensor for name, tensor in states.items()}
            for table, states in self.table_optimizer_states().items()
        }

    def has_disk_tables(self) -> bool:
        return any(batch.cache is not None for batch in self.batches)

    def prefetch_routed(self, inputs: Sequence[Any]) -> None:
        """Disk tables: start reading the rows of the next batch (its routed per-TBE ``indices`` /
        ``offsets``) into their caches while the current step computes."""
        for batch, item in zip(self.batches, inputs):
            batch.prefetch(item.indices, item.offsets)

    def flush(self) -> None:
        """Disk tables: write their caches' updated rows back to the files and empty the caches, so the
        weight parameters (views of the files) hold the whole tables and writes into them are read next."""
        for batch in self.batches:
            batch.flush()

    # The weight parameters of disk tables are views of their files, behind a cache: it is written back
    # before they are read whole and emptied before they are written (children are saved / loaded after
    # their parent's own hook, so these run first).
    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        self.flush()
        super()._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self.flush()
        super()._load_from_state_dict(*args, **kwargs)

    def reset_parameters(self, seed: int) -> None:
        """Give every table its initial values from ``seed`` (see ``rectrain.embedding.init``)."""
        if self.is_meta:
            return  # nothing allocated: the values are drawn where the tables (or shards) are built
        self.flush()
        for table in self.tables:
            init.fill_rows(self[table.name].weight, table, seed)

    def _aliases_intact(self) -> bool:
        views = self._weight_views()
        return all(
            self[name].weight.device == view.device
            and self[name].weight.dtype == view.dtype
            and (self.is_meta or self[name].weight.data_ptr() == view.data_ptr())
            for name, view in views.items()
        )

    def _rebind(self) -> None:
        for name, view in self._weight_views().items():
            self[name].weight.data = view

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        self._rebind()

    def _apply(self, fn: Any, recurse: bool = True) -> FusedTables:
        super()._apply(fn, recurse)
        if self._aliases_intact():
            return self
        moved = {t.name: self[t.name].weight for t in self.tables}
        if any(moved[t.name].dtype != _dtype(t) for t in self.tables):
            self._rebind()
            raise ValueError(
                "embedding tables cannot be cast to another dtype after construction; build the collection "
                "with the table data_type you need"
            )
        self._move(next(iter(moved.values())).device, moved)
        return self

    @torch.no_grad()
    def _move(self, device: torch.device, moved: dict[str, Tensor]) -> None:
        """Rebuild the kernels on ``device``, with the moved weights and the old kernels' optimizer state."""
        states = self.table_optimizer_states()
        lr = self.fused_optimizer.param_groups[0]["lr"]
        self._device = device
        self.batches = self._build_batches()
        views = self._weight_views()
        for name, view in views.items():
            if not self.is_meta:
                view.copy_(moved[name])
            self[name].weight.data = view
        new_states = self.table_optimizer_states()
        for table, values in states.items() if not self.is_meta else ():
            for name, value in values.items():
                new_states[table][name].copy_(value)
        self.fused_optimizer = self._make_optimizer(lr)


def _dtype(table: BaseEmbeddingConfig) -> torch.dtype:
    return torch.float16 if table.data_type is DataType.FP16 else torch.float32
