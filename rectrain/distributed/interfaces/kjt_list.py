"""``KJTList`` (``torchrec.distributed.embedding_types``): the per-sharding KeyedJaggedTensors one input
distribution produces, as one object a pipeline can move between streams and an fx graph can carry."""

from collections.abc import Iterator

import torch
from torch import fx

from rectrain.sparse import KeyedJaggedTensor


class KJTList:
    """A list of KeyedJaggedTensors (index, assign, iterate, ``len``)."""

    def __init__(self, features: list[KeyedJaggedTensor]) -> None:
        self.features = features

    def __len__(self) -> int:
        return len(self.features)

    def __setitem__(self, key: int, item: KeyedJaggedTensor) -> None:
        self.features[key] = item

    def __getitem__(self, key: int) -> KeyedJaggedTensor:
        return self.features[key]

    @torch.jit._drop
    def __iter__(self) -> Iterator[KeyedJaggedTensor]:
        return iter(self.features)

    @torch.jit._drop
    def record_stream(self, stream: torch.Stream) -> None:
        """Mark every member's tensors as used on ``stream`` (so their memory outlives work queued there)."""
        for feature in self.features:
            feature.record_stream(stream)

    @torch.jit._drop
    def __fx_create_arg__(self, tracer: fx.Tracer) -> fx.node.Argument:
        # A KJTList met as a constant during tracing is rebuilt in the graph from its members.
        return tracer.create_node(
            "call_function", KJTList, args=(tracer.create_arg(self.features),), kwargs={}
        )
