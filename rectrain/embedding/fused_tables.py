"""The tables of one collection: FBGEMM TBEs, per-table weight parameters aliasing them, fused optimizer."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import PoolingMode
from torch import Tensor, nn

from rectrain.embedding.config import BaseEmbeddingConfig, FusedOptimizerConfig
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

    The collection lives on the device it was built for; moving it with ``.to()`` would move only the aliases,
    so that raises. ``copy.deepcopy`` works (the aliases are re-pointed at the copied TBEs).

    Args:
        tables: all tables of the collection, in order.
        groups: indices into ``tables``, one list per TBE.
        poolings: FBGEMM pooling mode of each group.
        optimizer: the fused optimizer every TBE runs.
        device: where weights live and kernels run.
        prefix: the collection's attribute name, used for the optimizer's parameter keys.
    """

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
        self.batches = [
            FusedTableBatch([self.tables[i] for i in group], pooling, optimizer, device)
            for group, pooling in zip(groups, poolings)
        ]
        views = self._weight_views()
        for table in self.tables:
            self[table.name] = TableWeight(views[table.name])
        self._prefix = prefix
        self.fused_optimizer = FusedEmbeddingOptimizer(
            {self._param_key(t.name): self[t.name].weight for t in self.tables},
            self._optimizer_state,
            self.batches,
            optimizer,
        )
        for table in self.tables:
            # TorchRec's mark of a table updated in backward: in_backward_optimizer_filter leaves it out of
            # the optimizers built from model.named_parameters().
            self[table.name].weight._in_backward_optimizers = [self.fused_optimizer]

    def _param_key(self, table: str) -> str:
        return f"{self._prefix}.{table}.weight"

    def _weight_views(self) -> dict[str, Tensor]:
        return {
            table.name: view
            for batch in self.batches
            for table, view in zip(batch.tables, batch.table_weights())
        }

    def table_optimizer_states(self) -> dict[str, dict[str, Tensor]]:
        """``{table name: {state name: view}}`` of the fused optimizer's state (``momentum1``; Adam:
        ``exp_avg``, ``exp_avg_sq``, ``step``): views of the kernel storage; copying into them restores it."""
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

    def reset_parameters(self) -> None:
        """Draw every table uniformly in [weight_init_min, weight_init_max], tables in config order.

        Values come from torch's default CPU generator, so one seed gives the same tables on any device.
        """
        with torch.no_grad():
            for table in self.tables:
                weight = self[table.name].weight
                values = torch.empty(weight.shape, dtype=torch.float32)
                values.uniform_(table.get_weight_init_min(), table.get_weight_init_max())
                weight.copy_(values)

    def _aliases_intact(self) -> bool:
        views = self._weight_views()
        return all(
            self[name].weight.data_ptr() == view.data_ptr() and self[name].weight.dtype == view.dtype
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
        if not self._aliases_intact():
            self._rebind()
            raise ValueError(
                "embedding tables cannot be moved or cast after construction (their FBGEMM kernel stays "
                "where it was built); build the collection with device=... and the table data_type you need"
            )
        return self
