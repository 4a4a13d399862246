"""Turn a KeyedJaggedTensor into the ``indices``/``offsets`` each FBGEMM TBE of a collection reads.

A collection's TBEs read their features in a fixed order (per group: tables in order, each table's features
in order; a feature read by two tables appears twice). The KJT may hold its keys in any order and extra keys.
One ``kjt.permute`` per batch selects and orders the distinct features (the permutation is cached per key
order); each group then takes a slice of the permuted values.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import NamedTuple, Protocol

import torch
from torch import Tensor, nn


class KJTLike(Protocol):
    """The part of ``KeyedJaggedTensor``'s API the collections use."""

    def keys(self) -> list[str]: ...
    def values(self) -> Tensor: ...
    def offsets(self) -> Tensor: ...
    def stride(self) -> int: ...
    def weights_or_none(self) -> Tensor | None: ...
    def variable_stride_per_key(self) -> bool: ...
    def permute(self, indices: list[int], indices_tensor: Tensor | None = None) -> KJTLike: ...


def host_offsets(kjt: object) -> list[int] | None:
    """Where each key's values start (plus the end), if the KJT carries its per-key counts on the host."""
    offsets = getattr(kjt, "offset_per_key_or_none", lambda: None)()
    if offsets is not None:
        return offsets
    lengths = getattr(kjt, "length_per_key_or_none", lambda: None)()
    return None if lengths is None else [0, *itertools.accumulate(lengths)]


class TBEInput(NamedTuple):
    """One TBE's inputs in FBGEMM's layout: bag ``i = f * batch_size + b`` is
    ``indices[offsets[i]:offsets[i+1]]``."""

    indices: Tensor
    offsets: Tensor
    per_sample_weights: Tensor | None
    batch_size: int
    values_per_feature: list[int] | None  # None when not asked for and not known on the host (see route)


def feature_positions(keys: Sequence[str], features: Sequence[str]) -> list[int]:
    """Position in ``keys`` of each of ``features``; ValueError naming the missing ones and the keys."""
    position = {name: index for index, name in enumerate(keys)}
    missing = [name for name in features if name not in position]
    if missing:
        raise ValueError(
            f"KeyedJaggedTensor has no feature {missing[0]!r} (missing: {missing}); the collection "
            f"reads {sorted(set(features))} and the input has keys {list(keys)}"
        )
    return [position[name] for name in features]


class FeatureRouter(nn.Module):
    """Splits a KJT into per-group TBE inputs.

    The KJT is permuted once into the order of the distinct features; a group whose features form a
    contiguous run of that order is a slice of it (no copy), other groups (a feature read by tables in two
    groups, or twice by one group) gather their features' segments. A module (without parameters) so that
    a collection's ``torch.fx`` graph can reach it (``get_attr``) when it calls the lookup as one leaf.

    Args:
        group_features: for each TBE, the feature names it reads, in its feature order.
    """

    def __init__(self, group_features: Sequence[Sequence[str]]) -> None:
        super().__init__()
        self.group_features = [list(features) for features in group_features]
        self.features = list(dict.fromkeys(name for features in self.group_features for name in features))
        position = {name: index for index, name in enumerate(self.features)}
        self._group_positions = [[position[name] for name in features] for features in self.group_features]
        self._whole = self._group_positions == [list(range(len(self.features)))]
        self._permutations: dict[tuple[str, ...], tuple[list[int], Tensor] | None] = {}

    def _permutation(self, keys: list[str], device: torch.device) -> tuple[list[int], Tensor] | None:
        """Positions in ``keys`` of the distinct features (list, tensor); None when ``keys`` is that order."""
        key = tuple(keys)
        if key not in self._permutations:
            order = feature_positions(keys, self.features)
            same = order == list(range(len(keys)))
            self._permutations[key] = (
                None if same else (order, torch.tensor(order, dtype=torch.int32, device=device))
            )
        return self._permutations[key]

    def route(self, kjt: KJTLike, weighted: bool, counts: bool = True) -> list[TBEInput]:
        """Per group, the TBE inputs of ``kjt``; ``weighted`` passes ``kjt.weights()`` as id weights.

        Slicing features needs each feature's id count on the host: the KJT's ``offset_per_key`` when it
        carries them (a batch gets them on the host before its copy to a GPU, ``Batch.to``), else read from
        ``offsets``, which on a GPU waits for it. One group reading every feature in order needs no slicing,
        so on a GPU it takes the values whole and reads nothing (its ``values_per_feature`` is then None
        unless ``counts``)."""
        if kjt.variable_stride_per_key():
            raise ValueError("variable batch size per feature (VBE) KeyedJaggedTensors are not supported")
        permutation = self._permutation(list(kjt.keys()), kjt.values().device)
        if permutation is not None:
            kjt = kjt.permute(*permutation)
        values, offsets, batch_size = kjt.values(), kjt.offsets(), kjt.stride()
        weights = kjt.weights_or_none() if weighted else None
        if weighted and weights is None:
            raise ValueError(
                "this collection is weighted (is_weighted=True) but the KeyedJaggedTensor has no weights"
            )
        if offsets.dtype != values.dtype:
            values, offsets = values.long(), offsets.long()
        if weights is not None and weights.dtype != torch.float32:
            weights = weights.float()
        bounds = host_offsets(kjt)
        if bounds is None and values.is_cuda and not counts and self._whole:
            return [TBEInput(values, offsets, weights, batch_size, None)]
        if bounds is None:
            bounds = offsets[::batch_size].tolist() if batch_size else [0] * (len(self.features) + 1)
        segments = _Segments(values, offsets, weights, batch_size, bounds)
        return [segments.select(positions) for positions in self._group_positions]


class _Segments:
    """The features of one permuted KJT, each a segment of ``values``; selects a group's TBE input."""

    def __init__(
        self, values: Tensor, offsets: Tensor, weights: Tensor | None, batch_size: int, bounds: list[int]
    ) -> None:
        self.values, self.offsets, self.weights = values, offsets, weights
        self.batch_size, self.bounds = batch_size, bounds

    def select(self, positions: list[int]) -> TBEInput:
        bounds, batch = self.bounds, self.batch_size
        counts = [bounds[p + 1] - bounds[p] for p in positions]
        first = positions[0]
        if positions == list(range(first, first + len(positions))):
            last = first + len(positions)
            lo, hi = bounds[first], bounds[last]
            group_offsets = self.offsets[first * batch : last * batch + 1]
            return TBEInput(
                indices=self.values[lo:hi],
                offsets=group_offsets - lo if lo else group_offsets,
                per_sample_weights=None if self.weights is None else self.weights[lo:hi],
                batch_size=batch,
                values_per_feature=counts,
            )
        lengths = torch.cat([self.offsets[p * batch : (p + 1) * batch + 1].diff() for p in positions])
        weights = None
        if self.weights is not None:
            weights = torch.cat([self.weights[bounds[p] : bounds[p + 1]] for p in positions])
        return TBEInput(
            indices=torch.cat([self.values[bounds[p] : bounds[p + 1]] for p in positions]),
            offsets=torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]),
            per_sample_weights=weights,
            batch_size=batch,
            values_per_feature=counts,
        )
