"""Adam fused into backward for FBGEMM TBEs on CPU, where FBGEMM 1.8.0 has no Adam kernel.

``CpuAdamLookup`` is a ``rectrain.embedding.fused_update.FusedUpdateLookup``: forward runs FBGEMM's CPU
lookup kernel, and backward applies ``torch.optim.SparseAdam``'s update to the rows the batch read, in the
TBE's own weight storage: with the compiled fused backward (``rectrain.embedding.cpu_kernel``) where numba is
importable, else with torch ops (``rectrain.embedding.sparse_adam``).
"""

from __future__ import annotations

import math

import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen
from torch import Tensor

from rectrain.embedding.config import EmbOptimType, FusedOptimizerConfig, PoolingType
from rectrain.embedding.cpu_backward_runner import CompiledBackward, compiled_ready
from rectrain.embedding.fused_update import FusedUpdateLookup
from rectrain.embedding.sparse_adam import SparseAdamState, sparse_adam_update_, tbe_row_gradients


class CpuAdamLookup(FusedUpdateLookup):
    """A CPU TBE's lookup whose backward updates the touched rows with ``torch.optim.SparseAdam``'s rule.

    The Adam moments (``exp_avg``, ``exp_avg_sq``, flat like the weights) and one step count per table live
    here; every table's step advances on every backward, matching SparseAdam over one ``nn.EmbeddingBag`` per
    table that runs on every batch (and FBGEMM's CUDA Adam, which counts iterations per module).

    Args:
        tbe: a CPU TBE (``EmbeddingLocation.HOST``); only its weights and forward kernel are used.
        config: lr, betas, eps and weight_decay of the update; ``lr`` may be changed later via ``self.lr``.
        moments: zero-filled ``exp_avg`` and ``exp_avg_sq`` buffers to use (default: allocated here).
    """

    def __init__(
        self,
        tbe: SplitTableBatchedEmbeddingBagsCodegen,
        config: FusedOptimizerConfig,
        moments: tuple[Tensor, Tensor] | None = None,
    ) -> None:
        super().__init__(tbe)
        if moments is None:
            self.state = SparseAdamState.zeros(tbe.weights_host, self.layout)
        else:  # zero-filled buffers shaped like the weights, e.g. mapped files of a disk table
            step = torch.zeros(self.layout.num_tables, dtype=torch.int64)
            self.state = SparseAdamState(exp_avg=moments[0], exp_avg_sq=moments[1], step=step)
        self.lr = config.lr
        self.betas = (config.beta1, config.beta2)
        self.eps = config.eps
        self.weight_decay = config.weight_decay
        pooling = PoolingType[tbe.pooling_mode.name]
        self._compiled = (
            CompiledBackward(self.layout, EmbOptimType.ADAM, pooling, self.layout.weights_offsets)
            if compiled_ready()
            else None
        )

    def apply_gradient(
        self, grad_output: Tensor, indices: Tensor, offsets: Tensor, per_sample_weights: Tensor | None
    ) -> None:
        """Update the rows ``indices`` read, given the gradient of the lookup's output."""
        if self._compiled is not None:
            self._compiled_update((grad_output, indices, offsets, per_sample_weights))
            return
        row_grads = tbe_row_gradients(
            grad_output.contiguous(), indices, offsets, self.layout, self.tbe.pooling_mode, per_sample_weights
        )
        sparse_adam_update_(
            self.tbe.weights_host,
            self.state,
            row_grads,
            self.layout,
            lr=self.lr,
            betas=self.betas,
            eps=self.eps,
            weight_decay=self.weight_decay,
            step_untouched_tables=True,
        )

    @torch.no_grad()
    def _compiled_update(self, inputs: tuple[Tensor, Tensor, Tensor, Tensor | None]) -> None:
        """The same update, compiled; every table's step advances (``step_untouched_tables``)."""
        self.state.step.add_(1)
        beta1, beta2 = self.betas
        step_sizes = [
            self.lr * math.sqrt(1 - beta2**step) / (1 - beta1**step) for step in self.state.step.tolist()
        ]
        hyper = (self.lr, self.eps, 1 - beta1, 1 - beta2, self.weight_decay)
        states = [self.state.exp_avg, self.state.exp_avg_sq]
        assert self._compiled is not None
        self._compiled.run(inputs, self.tbe.weights_host, states, hyper, step_sizes)

    def table_states(self) -> list[dict[str, Tensor]]:
        """Per table: ``exp_avg``, ``exp_avg_sq`` as ``[rows, dim]`` views; ``step`` as a 1-element view."""
        return [
            {
                "exp_avg": self.layout.table_view(self.state.exp_avg, t),
                "exp_avg_sq": self.layout.table_view(self.state.exp_avg_sq, t),
                "step": self.state.step[t : t + 1],
            }
            for t in range(self.layout.num_tables)
        ]
