"""``torchrec.sparse.test_utils``: TorchRec's equality of two ``KeyedJaggedTensor`` s for tests.

With ``is_pooled_features`` the ids (and weights) of each bag may come in any order, as after a
bucketization that keeps each bag's ids but not their order.
"""

from __future__ import annotations

import math

import torch

from rectrain.sparse import KeyedJaggedTensor


def _tensor_eq_or_none(
    t1: torch.Tensor | None,
    t2: torch.Tensor | None,
    out_of_order: bool = False,
    length: torch.Tensor | None = None,
) -> bool:
    if t1 is None or t2 is None:
        return t1 is None and t2 is None
    if t1.dtype != t2.dtype:
        return False
    if not out_of_order:
        return torch.equal(t1, t2)
    assert length is not None
    values_1, values_2, offset = t1.tolist(), t2.tolist(), 0
    for n in length.tolist():
        bag_1, bag_2 = sorted(values_1[offset : offset + n]), sorted(values_2[offset : offset + n])
        if torch.is_floating_point(t1):
            if not all(math.isclose(a, b) for a, b in zip(bag_1, bag_2)):
                return False
        elif bag_1 != bag_2:
            return False
        offset += n
    return True


def keyed_jagged_tensor_equals(
    kjt1: KeyedJaggedTensor | None, kjt2: KeyedJaggedTensor | None, is_pooled_features: bool = False
) -> bool:
    if kjt1 is None or kjt2 is None:
        return kjt1 is None and kjt2 is None
    if kjt1.keys() != kjt2.keys() or not _tensor_eq_or_none(kjt1.lengths(), kjt2.lengths()):
        return False
    lengths = kjt1.lengths()
    return _tensor_eq_or_none(
        kjt1.values(), kjt2.values(), is_pooled_features, lengths
    ) and _tensor_eq_or_none(kjt1.weights_or_none(), kjt2.weights_or_none(), is_pooled_features, lengths)
