"""Per-batch contexts of TorchRec's sharded-module protocol (``ShardedEmbeddingModule``).

A sharded module's ``input_dist`` records what its ``output_dist`` needs later (splits, batch sizes, the
features before the all-to-all) in a context created per batch. These are TorchRec's context types with its
field names (``torchrec.distributed.sharding.sequence_sharding.SequenceShardingContext``,
``torchrec.distributed.embedding.EmbeddingCollectionContext``,
``torchrec.distributed.embeddingbag.EmbeddingBagCollectionContext``), so modules written against that protocol
port; ``record_stream`` keeps their tensors alive on another CUDA stream.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from rectrain.sparse import KeyedJaggedTensor


def _record(stream: torch.Stream, *values: Any) -> None:
    for value in values:
        if value is not None:
            value.record_stream(stream)


@dataclass
class EmbeddingShardingContext:
    """What one sharding of a module remembers between input and output distribution."""

    batch_size_per_rank: list[int] = field(default_factory=list)
    batch_size_per_rank_per_feature: list[list[int]] = field(default_factory=list)
    batch_size_per_feature_pre_a2a: list[int] = field(default_factory=list)
    variable_batch_per_feature: bool = False

    def record_stream(self, stream: torch.Stream) -> None:
        pass


@dataclass
class SequenceShardingContext(EmbeddingShardingContext):
    """A sequence sharding's context: the all-to-all's splits (the embeddings return the same way), the
    features before it, and the row-wise bucketing's permutation."""

    features_before_input_dist: KeyedJaggedTensor | None = None
    input_splits: list[int] = field(default_factory=list)
    output_splits: list[int] = field(default_factory=list)
    sparse_features_recat: torch.Tensor | None = None
    unbucketize_permute_tensor: torch.Tensor | None = None
    lengths_after_input_dist: torch.Tensor | None = None

    def record_stream(self, stream: torch.Stream) -> None:
        _record(
            stream,
            self.features_before_input_dist,
            self.sparse_features_recat,
            self.unbucketize_permute_tensor,
            self.lengths_after_input_dist,
        )


@dataclass
class EmbeddingCollectionContext:
    """An ``EmbeddingCollection``'s batch: one context per sharding, and the inputs that the output's
    jagged tensors are rebuilt from."""

    sharding_contexts: list[SequenceShardingContext] = field(default_factory=list)
    input_features: list[KeyedJaggedTensor] = field(default_factory=list)
    reverse_indices: list[torch.Tensor] = field(default_factory=list)
    seq_vbe_ctx: list[Any] = field(default_factory=list)
    table_name_to_unpruned_hash_sizes: dict[str, int] = field(default_factory=dict)
    inverse_indices: tuple[list[str], torch.Tensor] | None = None  # TorchRec's VBE fields, kept as given
    variable_batch_per_feature: bool = False

    def record_stream(self, stream: torch.Stream) -> None:
        for ctx in self.sharding_contexts:
            ctx.record_stream(stream)
        _record(stream, *self.input_features, *self.reverse_indices)


@dataclass
class EmbeddingBagCollectionContext:
    """An ``EmbeddingBagCollection``'s batch: one context per sharding, the inverse indices of a
    variable-batch input, and the MEAN-pooling divisor."""

    sharding_contexts: list[EmbeddingShardingContext | None] = field(default_factory=list)
    inverse_indices: tuple[list[str], torch.Tensor] | None = None
    variable_batch_per_feature: bool = False
    divisor: torch.Tensor | None = None

    def record_stream(self, stream: torch.Stream) -> None:
        for ctx in self.sharding_contexts:
            if ctx is not None:
                ctx.record_stream(stream)
        _record(stream, None if self.inverse_indices is None else self.inverse_indices[1], self.divisor)


def set_sharding_context_post_a2a(kjts: list[KeyedJaggedTensor], ctx: Any) -> None:
    """After a variable-batch input all-to-all: each sharding's ``batch_size_per_rank_per_feature`` from
    its received features' strides (``[rank][feature]``; the features hold them ``[feature][rank]``)."""
    for kjt, context in zip(kjts, getattr(ctx, "sharding_contexts", [])):
        if not hasattr(context, "batch_size_per_rank_per_feature") or not kjt.variable_stride_per_key():
            continue
        strides = kjt.stride_per_key_per_rank()
        if strides:
            context.batch_size_per_rank_per_feature = [list(per_rank) for per_rank in zip(*strides)]
