"""``torchrec.distributed.embedding`` at rectrain's path: its sharder, the sharded collection, and the
output side of TorchRec's sharded-module protocol for sequence embeddings."""

from __future__ import annotations

from torch import Tensor

from rectrain.distributed.interfaces.awaitable import Awaitable, LazyAwaitable
from rectrain.distributed.interfaces.contexts import EmbeddingCollectionContext
from rectrain.distributed.parallel.sharders import EmbeddingCollectionSharder
from rectrain.distributed.sharded.embedding import ShardedEmbeddingCollection
from rectrain.modules.utils import construct_jagged_tensors
from rectrain.sparse import JaggedTensor, KeyedJaggedTensor

__all__ = [
    "EmbeddingCollectionAwaitable",
    "EmbeddingCollectionContext",
    "EmbeddingCollectionSharder",
    "ShardedEmbeddingCollection",
    "construct_jagged_tensors",
]


class EmbeddingCollectionAwaitable(LazyAwaitable[dict[str, JaggedTensor]]):
    """The output of a sharded ``EmbeddingCollection``: per sharding, the rows that came back (an
    awaitable) turned into one ``JaggedTensor`` per embedding name (``construct_jagged_tensors``).

    ``use_gather_select`` picks gather over index_select to undo de-duplication;
    ``use_gather_select_per_sharding`` overrides it per sharding type (``sharding_types`` names each one).
    """

    def __init__(
        self,
        awaitables_per_sharding: list[Awaitable[Tensor]],
        features_per_sharding: list[KeyedJaggedTensor],
        embedding_names_per_sharding: list[list[str]],
        ctx: EmbeddingCollectionContext,
        need_indices: bool = False,
        features_to_permute_indices: dict[str, list[int]] | None = None,
        module_fqn: str | None = None,
        sharding_types: list[str] | None = None,
        use_gather_select: bool = False,
        use_gather_select_per_sharding: dict[str, bool] | None = None,
        resize_awaitables: list[Awaitable[Tensor]] | None = None,
    ) -> None:
        super().__init__()
        self._awaitables_per_sharding = awaitables_per_sharding
        self._features_per_sharding = features_per_sharding
        self._embedding_names_per_sharding = embedding_names_per_sharding
        self._ctx = ctx
        self._need_indices = need_indices
        self._features_to_permute_indices = features_to_permute_indices
        self._module_fqn = module_fqn
        self._sharding_types = sharding_types
        self._use_gather_select = use_gather_select
        self._use_gather_select_per_sharding = use_gather_select_per_sharding or {}
        self._resize_awaitables = resize_awaitables or []

    def _gather_select(self, i: int) -> bool:
        kind = self._sharding_types[i] if self._sharding_types else None
        return self._use_gather_select_per_sharding.get(kind, self._use_gather_select)

    def _wait_impl(self) -> dict[str, JaggedTensor]:
        for resize in self._resize_awaitables:
            resize.wait()
        ctx, out = self._ctx, {}
        shardings = zip(
            self._awaitables_per_sharding, self._features_per_sharding, self._embedding_names_per_sharding
        )
        for i, (pending, features, names) in enumerate(shardings):
            out.update(
                construct_jagged_tensors(
                    embeddings=pending.wait(),
                    features=features,
                    embedding_names=names,
                    need_indices=self._need_indices,
                    features_to_permute_indices=self._features_to_permute_indices,
                    original_features=ctx.input_features[i] if i < len(ctx.input_features) else None,
                    reverse_indices=ctx.reverse_indices[i] if i < len(ctx.reverse_indices) else None,
                    seq_vbe_ctx=ctx.seq_vbe_ctx[i] if i < len(ctx.seq_vbe_ctx) else None,
                    use_gather_select=self._gather_select(i),
                )
            )
        return out
