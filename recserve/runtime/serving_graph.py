"""The serving forward as one TorchScript call per batch: the batch thread takes the GIL once, not per op.

Eager PyTorch releases the GIL inside every op and takes it back after. In a server whose handler threads run
Python, the batch thread then queues for the GIL after each of its ~100 ops: on a 2-core AVX2 machine, eager
predict at batch 64 takes 6.1 ms next to 16 Python threads that mimic handlers, 1.9 ms alone; through the
graph, 2.8 ms (the request checks before it are still Python).

The dense part (everything after the pooled lookups) is traced around a stand-in for the lookups that hands
it the pooled tensor. When the lookups are one FBGEMM kernel fed the KJT as it comes (``single_kernel``),
that kernel's scriptable module runs in the same graph; otherwise the lookups run eagerly and the traced
dense part after them. Before it is used, the graph must give bit-identical logits to the eager model on a
batch of another size than it was traced with (so no batch size or id count was frozen into it); if
building or that check fails, the eager model serves and the reason is logged. TorchScript is deprecated as
of torch 2.13 (its warning is silenced here): when it is gone, building fails and the eager model serves.
"""

from __future__ import annotations

import logging
import warnings

import torch
from torch import Tensor, nn

from recserve.runtime.assembly import replace_module
from recserve.runtime.quant_embedding import QuantEmbeddingBagCollection
from rectrain.sparse import KeyedJaggedTensor, KeyedTensor

logger = logging.getLogger(__name__)

_TRACE_BATCH, _CHECK_BATCH = 4, 3


class _PooledStandIn(nn.Module):
    """Takes the lookups' place while tracing: wraps the pooled tensor it is given in their KeyedTensor."""

    def __init__(self, keys: list[str], length_per_key: list[int]) -> None:
        super().__init__()
        self.keys, self.length_per_key = keys, length_per_key

    def forward(self, pooled: Tensor) -> KeyedTensor:
        return KeyedTensor(keys=self.keys, length_per_key=self.length_per_key, values=pooled, key_dim=1)


class _KernelThenDense(nn.Module):
    """The FBGEMM kernel's pooled output straight into the traced dense part."""

    def __init__(self, kernel: nn.Module, dense_part: nn.Module) -> None:
        super().__init__()
        self.kernel, self.dense_part = kernel, dense_part

    def forward(
        self, dense: Tensor, indices: Tensor, offsets: Tensor, per_sample_weights: Tensor | None
    ) -> Tensor:
        return self.dense_part(dense, self.kernel(indices, offsets, per_sample_weights))


class ServingGraph:
    """``graph(dense, kjt) -> logits``, the prediction module's forward without per-op Python."""

    def __init__(
        self, lookups: QuantEmbeddingBagCollection, dense_part: nn.Module, whole: nn.Module | None
    ) -> None:
        self._lookups, self._dense_part, self._whole = lookups, dense_part, whole

    @property
    def fused(self) -> bool:
        """Whether the lookups run inside the graph (for KJTs that feed the kernel as they are)."""
        return self._whole is not None

    def __call__(self, dense: Tensor, kjt: KeyedJaggedTensor) -> Tensor:
        if self._whole is not None:
            inputs = self._lookups.single_kernel_inputs(kjt)
            if inputs is not None:
                # The JIT's optimising executor re-profiles per new input shape; the plain one runs at once.
                with torch.jit.optimized_execution(False):
                    return self._whole(dense, *inputs)
        return self.routed(dense, kjt)

    def routed(self, dense: Tensor, kjt: KeyedJaggedTensor) -> Tensor:
        """The eager lookups, then the traced dense part (what ``graph(dense, kjt)`` does when not fused)."""
        return self.after_lookups(dense, self._lookups(kjt).values())

    def after_lookups(self, dense: Tensor, pooled: Tensor) -> Tensor:
        """The traced dense part on the lookups' pooled output ``[B, sum of dims]`` (a caller that pools
        some rows itself, such as the recommend pipeline's ranking stage)."""
        with torch.jit.optimized_execution(False):
            return self._dense_part(dense, pooled)


def build_serving_graph(
    model: nn.Module,
    ebc_path: str,
    dense_in_features: int,
    num_embeddings: dict[str, int],
    dtype: torch.dtype,
) -> ServingGraph | None:
    """The graph of ``model`` (lookups at ``ebc_path``), checked against it; None if it cannot be built."""
    lookups = model.get_submodule(ebc_path)
    if not isinstance(lookups, QuantEmbeddingBagCollection) or lookups.device.type != "cpu":
        return None
    weighted = lookups.is_weighted()
    # In the kernel's feature order, so a fused graph is checked on its fused path (and on the routed one).
    order = lookups.feature_order
    traced_with = _example(_TRACE_BATCH, order, dense_in_features, num_embeddings, dtype, weighted)
    checked_on = _example(_CHECK_BATCH, order, dense_in_features, num_embeddings, dtype, weighted)
    try:
        with torch.inference_mode(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # TorchScript's deprecation and tracer warnings
            graph = _trace(model, ebc_path, lookups, *traced_with)
            expected = model(*checked_on)
            got = [graph(*checked_on), graph.routed(*checked_on)]
    except Exception as error:  # any model code the tracer or scripting cannot take
        logger.info("serving the eager model: its TorchScript graph could not be built (%s)", error)
        return None
    if not all(torch.equal(expected, logits) for logits in got):
        logger.warning("serving the eager model: its TorchScript graph does not reproduce its logits")
        return None
    return graph


def _trace(
    model: nn.Module,
    ebc_path: str,
    lookups: QuantEmbeddingBagCollection,
    dense: Tensor,
    kjt: KeyedJaggedTensor,
) -> ServingGraph:
    pooled = lookups(kjt)
    replace_module(model, ebc_path, _PooledStandIn(pooled.keys(), pooled.length_per_key()))
    try:
        dense_part = torch.jit.trace(model, (dense, pooled.values()), check_trace=False)
    finally:
        replace_module(model, ebc_path, lookups)
    kernel = lookups.single_kernel()
    whole = None if kernel is None else torch.jit.script(_KernelThenDense(kernel, dense_part))
    return ServingGraph(lookups, dense_part, whole)


def _example(
    batch: int,
    feature_names: list[str],
    dense_in_features: int,
    num_embeddings: dict[str, int],
    dtype: torch.dtype,
    weighted: bool,
) -> tuple[Tensor, KeyedJaggedTensor]:
    """A valid batch: 0-2 ids per bag (empty bags too), each inside its table, seeded."""
    g = torch.Generator().manual_seed(batch)
    lengths = torch.arange(len(feature_names) * batch) % 3
    per_feature = lengths.view(len(feature_names), batch).sum(1).tolist()
    values = torch.cat(
        [
            torch.randint(0, num_embeddings[name], (n,), generator=g)
            for name, n in zip(feature_names, per_feature)
        ]
    )
    weights = torch.rand(values.numel(), generator=g) if weighted else None
    kjt = KeyedJaggedTensor(keys=feature_names, values=values, lengths=lengths, weights=weights)
    return torch.randn(batch, dense_in_features, generator=g).to(dtype), kjt
