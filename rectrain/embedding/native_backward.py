"""Our CPU fused embedding backward for FBGEMM TBEs (SGD, Adagrad, row-wise Adagrad), and which kernel runs.

FBGEMM 1.8.0's CPU backward converts each table's CSR input to CSC one table after another before its
update kernel; on a 2-core AVX2 EPYC that serial part was 105 ms of a 116 ms step (issue 13). Ours, compiled
with numba (``rectrain.embedding.cpu_kernel``), links each row's positions, reduces them and updates the row
in one pass, tables (or row parts of a table) spread over all threads. Where numba cannot be imported the
same update runs with torch ops (``rectrain.embedding.torch_ops_backward``), which is slower than FBGEMM.

The math is FBGEMM's (``split_embedding_backward_codegen_*_cpu``): exact (coalesced) SGD, element-wise
Adagrad ``m += g*g; w -= lr * g / (sqrt(m) + eps)``, row-wise Adagrad with ``m += mean(g*g)``. One
difference: under weighted MEAN pooling FBGEMM 1.8.0's CPU backward scales ids by their weight alone, while
its forward divides by the bag length; ours uses the true gradient, weight / length (the collections run
weighted MEAN tables as SUM and divide afterwards, so only direct TBE users see this). Weight decay is left
to FBGEMM (``use_native_backward`` declines it). The state lives in the TBE's own buffers, so
checkpoints and kernels are interchangeable: either backward may continue a run the other started.

Which kernel runs is ``rectrain.embedding.backward_choice``'s decision (``auto``: ours wherever it compiles).
"""

from __future__ import annotations

import torch
from fbgemm_gpu.split_embedding_configs import SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen
from torch import Tensor

from rectrain.embedding.backward_choice import NATIVE_OPTIMIZERS, cpu_backward_choice, log_choice
from rectrain.embedding.config import EmbOptimType, FusedOptimizerConfig, PoolingType
from rectrain.embedding.cpu_backward_runner import CompiledBackward, compiled_ready
from rectrain.embedding.fused_update import FusedUpdateLookup
from rectrain.embedding.torch_ops_backward import torch_ops_update_


def use_native_backward(config: FusedOptimizerConfig, device: torch.device, precision: SparseType) -> bool:
    """Whether a TBE with this optimizer, device and weight precision runs the native CPU backward."""
    if config.optimizer not in NATIVE_OPTIMIZERS or precision != SparseType.FP32:
        return False
    choice = cpu_backward_choice(config, device)
    if config.cpu_backward == "auto" and device.type == "cpu":
        log_choice(choice)
    return choice.kernel == "native"


class NativeFusedLookup(FusedUpdateLookup):
    """A CPU TBE's lookup whose backward is ours (compiled, else torch ops) instead of FBGEMM's, on the TBE's
    own weights, state (``momentum1``) and learning rate.

    Args:
        tbe: a CPU TBE with fp32 weights, built with the optimizer ``config`` names (its state buffers are
            the ones updated here).
        config: the fused optimizer (SGD, Adagrad or row-wise Adagrad); eps is read here.
    """

    def __init__(self, tbe: SplitTableBatchedEmbeddingBagsCodegen, config: FusedOptimizerConfig) -> None:
        super().__init__(tbe)
        self.optimizer = config.optimizer
        self.pooling = PoolingType[tbe.pooling_mode.name]
        self.eps = config.eps
        self._compiled = (
            CompiledBackward(self.layout, self.optimizer, self.pooling, self._state_offsets())
            if compiled_ready()
            else None
        )

    def _state_offsets(self) -> list[int]:
        """Where each table's state starts in ``momentum1_host`` (floats; rows for row-wise Adagrad)."""
        if self.optimizer is EmbOptimType.SGD:
            return [0] * self.layout.num_tables
        base = self.tbe.momentum1_host.storage_offset()
        return [per_table[0].storage_offset() - base for per_table in self.tbe.split_optimizer_states()]

    @torch.no_grad()
    def apply_gradient(
        self, grad_output: Tensor, indices: Tensor, offsets: Tensor, per_sample_weights: Tensor | None
    ) -> None:
        """Update the rows ``indices`` read, given the gradient of the lookup's output."""
        if self._compiled is None:
            inputs = (grad_output, indices, offsets, per_sample_weights)
            torch_ops_update_(self.tbe, self.layout, self.optimizer, self.pooling, self.eps, inputs)
            return
        states = [] if self.optimizer is EmbOptimType.SGD else [self.tbe.momentum1_host]
        hyper = (self.tbe.get_learning_rate(), self.eps, 0.0, 0.0, 0.0)
        inputs = (grad_output, indices, offsets, per_sample_weights)
        self._compiled.run(inputs, self.tbe.weights_host, states, hyper)
