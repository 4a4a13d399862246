"""DLRM and DLRM_DCN (``torchrec.models.dlrm``): bottom MLP, pooled embeddings, interaction, top MLP.

    dense [B, dense_in] ── dense_arch ──► [B, D] ─┐
                                                  ├─ inter_arch ─► [B, D + F(F+1)/2] ─ over_arch ─► [B, 1]
    sparse KJT ── sparse_arch (EBC) ──► [B, F, D] ┘

``DLRM_DCN`` replaces the dot interaction by a DCN-v2 cross net over the flattened ``[dense; sparse]``
(``inter_arch`` output ``[B, (F + 1) D]``). Module and argument names, and the state-dict layout, are
TorchRec's. ``DistributedModelParallel`` replaces ``sparse_arch.embedding_bag_collection`` with its sharded
form; nothing here depends on which one it is.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn
from torch.fx._symbolic_trace import is_fx_symbolic_tracing

from rectrain.embedding import EmbeddingBagCollection
from rectrain.embedding.layout import get_embedding_names_by_table
from rectrain.errors import ConfigError
from rectrain.models.batch import Batch
from rectrain.models.crossnet import LowRankCrossNet
from rectrain.models.mlp import MLP, check_layer_sizes
from rectrain.sparse import KeyedJaggedTensor, KeyedTensor


class SparseArch(nn.Module):
    """Pooled embeddings of every feature stacked as ``[B, F, D]`` (F features, one embedding dim D).

    Features come in table order, each table's ``feature_names`` in order (a feature read by several tables
    appears once per table, keyed ``"<feature>@<table>"``).
    """

    def __init__(self, embedding_bag_collection: EmbeddingBagCollection) -> None:
        super().__init__()
        configs = embedding_bag_collection.embedding_bag_configs()
        if not configs:
            raise ConfigError("embedding_bag_collection has no tables; DLRM needs at least one")
        dims = {table.embedding_dim for table in configs}
        if len(dims) != 1:
            raise ConfigError(
                "every table of embedding_bag_collection must have the same embedding_dim for the dot "
                f"interaction, got {sorted(dims)}"
            )
        self.embedding_bag_collection = embedding_bag_collection
        self._sparse_feature_names = [n for names in get_embedding_names_by_table(configs) for n in names]
        self.F = len(self._sparse_feature_names)
        self.D = configs[0].embedding_dim

    @property
    def sparse_feature_names(self) -> list[str]:
        return self._sparse_feature_names

    def forward(self, features: KeyedJaggedTensor) -> Tensor:
        pooled: KeyedTensor = self.embedding_bag_collection(features)
        # While torch.fx traces, ``pooled`` is a proxy whose keys cannot be compared: take the general path.
        if not is_fx_symbolic_tracing() and pooled.keys() == self._sparse_feature_names:
            values = pooled.values()  # already in feature order: no copy
        else:
            by_name = pooled.to_dict()
            values = torch.cat([by_name[name] for name in self._sparse_feature_names], dim=1)
        return values.reshape(-1, self.F, self.D)


class DenseArch(nn.Module):
    """The bottom MLP: ``[B, in_features] -> [B, layer_sizes[-1]]``, ReLU after every layer."""

    def __init__(
        self, in_features: int, layer_sizes: Sequence[int], device: torch.device | str | None = None
    ) -> None:
        super().__init__()
        self.model = MLP(in_features, layer_sizes, bias=True, activation="relu", device=device)

    def forward(self, features: Tensor) -> Tensor:
        return self.model(features)


def _gram_pairs(combined: Tensor, pairs: Tensor) -> Tensor:
    """``bmm(Z, Z^T)`` at the flat positions ``pairs`` of each ``[N, N]`` product: ``[B, N, D] -> [B, P]``."""
    n = combined.shape[1]
    return torch.bmm(combined, combined.transpose(1, 2)).reshape(-1, n * n).index_select(1, pairs)


class _PairwiseDots(torch.autograd.Function):
    """``_gram_pairs`` with a backward of its own, for eager training.

    Autograd's own backward of ``bmm(Z, Z^T)`` runs two batched products on transposed views and adds them
    (7.8 of the interaction's 10 ms a step, batch 2048, one thread); ``Z Z^T`` is symmetric, so the gradient
    is ``(G + G^T) Z`` with ``G`` the upstream gradient scattered to ``[B, N, N]``: one product on contiguous
    operands (the interaction forward and backward together 2x faster). Same values, summed in another order.
    """

    @staticmethod
    def forward(ctx, combined: Tensor, pairs: Tensor) -> Tensor:
        ctx.save_for_backward(combined, pairs)
        return _gram_pairs(combined, pairs)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        combined, pairs = ctx.saved_tensors
        n = combined.shape[1]
        upstream = grad.new_zeros(grad.shape[0], n * n).index_copy_(1, pairs, grad).view(-1, n, n)
        return torch.bmm(upstream + upstream.transpose(1, 2), combined), None


class InteractionArch(nn.Module):
    """``cat(dense, upper triangle of Z Z^T)`` with ``Z = [dense; sparse_1..F]`` of shape ``[B, F + 1, D]``.

    Output ``[B, D + F(F+1)/2]``: the dense vector followed by the dot product of every distinct pair of
    rows of Z (diagonal excluded), in row-major order of the upper triangle.
    """

    def __init__(self, num_sparse_features: int, device: torch.device | str | None = None) -> None:
        super().__init__()
        self.F = num_sparse_features
        triu = torch.triu_indices(self.F + 1, self.F + 1, offset=1, device=device)
        self.register_buffer("triu_indices", triu, persistent=False)  # TorchRec's buffer
        # The same pairs as positions in the flattened [F + 1, F + 1] product, which both paths select.
        self.register_buffer("triu_flat", triu[0] * (self.F + 1) + triu[1], persistent=False)

    def forward(self, dense_features: Tensor, sparse_features: Tensor) -> Tensor:
        if self.F <= 0:
            return dense_features
        combined = torch.cat((dense_features.unsqueeze(1), sparse_features), dim=1)
        if not torch.jit.is_scripting() and self._trains_eagerly(combined):
            return torch.cat((dense_features, self._pairwise_dots(combined)), dim=1)
        return torch.cat((dense_features, _gram_pairs(combined, self.triu_flat)), dim=1)

    @torch.jit.unused
    def _trains_eagerly(self, combined):  # unannotated: TorchScript cannot resolve the string annotations
        """Eager autograd only: tracers and compilers (fx, jit.trace, torch.compile / export) record the
        plain ops, which they know how to differentiate; inference has no backward to speed up."""
        if is_fx_symbolic_tracing() or torch.jit.is_tracing() or torch.compiler.is_compiling():
            return False
        return torch.is_grad_enabled() and combined.requires_grad

    @torch.jit.unused
    def _pairwise_dots(self, combined):  # unannotated, as above
        return _PairwiseDots.apply(combined, self.triu_flat)


class OverArch(nn.Module):
    """The top MLP: ReLU layers ``layer_sizes[:-1]``, then a plain Linear to ``layer_sizes[-1]`` (logits).

    Unlike TorchRec, a single size is allowed (the arch is then one Linear).
    """

    def __init__(
        self, in_features: int, layer_sizes: Sequence[int], device: torch.device | str | None = None
    ) -> None:
        super().__init__()
        sizes = check_layer_sizes("over_arch_layer_sizes", layer_sizes)
        last_in = sizes[-2] if len(sizes) > 1 else in_features
        self.model = nn.Sequential(
            MLP(in_features, sizes[:-1], bias=True, activation="relu", device=device),
            nn.Linear(last_in, sizes[-1], bias=True, device=device),
        )

    def forward(self, features: Tensor) -> Tensor:
        return self.model(features)


def _bottom_archs(
    embedding_bag_collection: EmbeddingBagCollection,
    dense_in_features: int,
    dense_arch_layer_sizes: list[int],
    dense_device: torch.device | str | None,
) -> tuple[SparseArch, DenseArch]:
    """The sparse and dense archs of DLRM and DLRM_DCN, with the check that their widths agree."""
    check_layer_sizes("dense_in_features", [dense_in_features])
    dense_sizes = check_layer_sizes("dense_arch_layer_sizes", dense_arch_layer_sizes)
    sparse_arch = SparseArch(embedding_bag_collection)
    if dense_sizes[-1] != sparse_arch.D:
        raise ConfigError(
            f"dense_arch_layer_sizes[-1] ({dense_sizes[-1]}) must equal the tables' embedding_dim "
            f"({sparse_arch.D}): the bottom MLP output is combined with each pooled embedding"
        )
    return sparse_arch, DenseArch(dense_in_features, dense_sizes, device=dense_device)


class DLRM(nn.Module):
    """Deep Learning Recommendation Model (Naumov et al., 2019), as ``torchrec.models.dlrm.DLRM``.

    Args:
        embedding_bag_collection: the sparse tables; all must share one embedding_dim D.
        dense_in_features: width of the dense input.
        dense_arch_layer_sizes: bottom MLP sizes; the last must equal D.
        over_arch_layer_sizes: top MLP sizes; the last is the number of logits (usually 1).
        dense_device: where the dense part lives (default cpu).

    ``forward(dense_features [B, dense_in_features], sparse_features KJT) -> logits [B, over[-1]]``.
    """

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        dense_in_features: int,
        dense_arch_layer_sizes: list[int],
        over_arch_layer_sizes: list[int],
        dense_device: torch.device | str | None = None,
    ) -> None:
        super().__init__()
        check_layer_sizes("over_arch_layer_sizes", over_arch_layer_sizes)
        self.sparse_arch, self.dense_arch = _bottom_archs(
            embedding_bag_collection, dense_in_features, dense_arch_layer_sizes, dense_device
        )
        dim, num_features = self.sparse_arch.D, self.sparse_arch.F
        self.inter_arch = InteractionArch(num_features, device=dense_device)
        over_in_features = dim + num_features * (num_features + 1) // 2
        self.over_arch = OverArch(over_in_features, over_arch_layer_sizes, device=dense_device)

    def forward(self, dense_features: Tensor, sparse_features: KeyedJaggedTensor) -> Tensor:
        embedded_dense = self.dense_arch(dense_features)
        embedded_sparse = self.sparse_arch(sparse_features)
        concatenated = self.inter_arch(dense_features=embedded_dense, sparse_features=embedded_sparse)
        return self.over_arch(concatenated)


class InteractionDCNArch(nn.Module):
    """DCN-v2 interaction: ``crossnet(flatten([dense; sparse_1..F]))``, ``[B, (F + 1) D]`` in and out.

    As ``torchrec.models.dlrm.InteractionDCNArch``; ``crossnet`` is usually a ``LowRankCrossNet``.
    """

    def __init__(self, num_sparse_features: int, crossnet: nn.Module) -> None:
        super().__init__()
        self.F = num_sparse_features
        self.crossnet = crossnet

    def forward(self, dense_features: Tensor, sparse_features: Tensor) -> Tensor:
        if self.F <= 0:
            return dense_features
        combined = torch.cat((dense_features.unsqueeze(1), sparse_features), dim=1)
        return self.crossnet(combined.reshape(dense_features.shape[0], -1))


class DLRM_DCN(DLRM):  # noqa: N801 - TorchRec's name
    """DLRM whose interaction is a low-rank DCN-v2 cross net (``torchrec.models.dlrm.DLRM_DCN``).

    Arguments as ``DLRM``, plus ``dcn_num_layers`` and ``dcn_low_rank_dim`` of the ``LowRankCrossNet`` over
    the ``(F + 1) * D`` concatenated dense and pooled sparse features; the over arch reads its output.
    Submodule names (``sparse_arch``, ``dense_arch``, ``inter_arch.crossnet``, ``over_arch``) are TorchRec's;
    ``forward`` is DLRM's.
    """

    def __init__(
        self,
        embedding_bag_collection: EmbeddingBagCollection,
        dense_in_features: int,
        dense_arch_layer_sizes: list[int],
        over_arch_layer_sizes: list[int],
        dcn_num_layers: int,
        dcn_low_rank_dim: int,
        dense_device: torch.device | str | None = None,
    ) -> None:
        nn.Module.__init__(self)  # DLRM's parts are built here, in this order (same weights per seed)
        self.sparse_arch, self.dense_arch = _bottom_archs(
            embedding_bag_collection, dense_in_features, dense_arch_layer_sizes, dense_device
        )
        width = (self.sparse_arch.F + 1) * self.sparse_arch.D
        crossnet = LowRankCrossNet(width, dcn_num_layers, dcn_low_rank_dim, device=dense_device)
        self.inter_arch = InteractionDCNArch(self.sparse_arch.F, crossnet)
        self.over_arch = OverArch(width, over_arch_layer_sizes, device=dense_device)


class DLRMPrediction(nn.Module):
    """The serving form of a ``DLRM`` or ``DLRM_DCN`` (one logit): ``forward(dense, kjt) -> logits [B]``.

    Its single child is ``model``, so state-dict keys are ``model.`` + TorchRec's DLRM keys, e.g.
    ``model.sparse_arch.embedding_bag_collection.embedding_bags.<table>.weight``.
    """

    def __init__(self, dlrm_module: nn.Module) -> None:
        super().__init__()
        self.model = dlrm_module

    def forward(self, dense_features: Tensor, sparse_features: KeyedJaggedTensor) -> Tensor:
        return self.model(dense_features, sparse_features).squeeze(-1)


class DLRMTrain(nn.Module):
    """DLRM plus binary cross-entropy on its single logit (``torchrec.models.dlrm.DLRMTrain``).

    ``dlrm_module`` gives logits ``[B, 1]`` (``DLRM``, ``DLRM_DCN``) or ``[B]`` (``DLRMPrediction``).
    ``forward(batch) -> (loss, (loss.detach(), logits.detach(), labels.detach()))`` with logits ``[B]``.
    ``.prediction_model`` is the child ``model``.
    """

    def __init__(self, dlrm_module: nn.Module) -> None:
        super().__init__()
        self.model = dlrm_module
        self.loss_fn = nn.BCEWithLogitsLoss()

    @property
    def prediction_model(self) -> nn.Module:
        return self.model

    def forward(self, batch: Batch) -> tuple[Tensor, tuple[Tensor, Tensor, Tensor]]:
        logits = self.model(batch.dense_features, batch.sparse_features)
        if logits.dim() == 2:  # squeeze only the logit column: a batch of one stays [1]
            logits = logits.squeeze(-1)
        loss = self.loss_fn(logits, batch.labels.float())
        return loss, (loss.detach(), logits.detach(), batch.labels.detach())
