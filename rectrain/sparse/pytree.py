"""Registers the sparse types as ``torch.utils._pytree`` nodes (as TorchRec does).

Tensors become the leaves, keys and strides the (hashable) context, so ``torch.export``, ``tree_map`` and
friends see through the types. Unflattening skips validation: leaves may be fake or meta tensors.
``register_sparse_pytrees`` is called once when ``rectrain.sparse`` is imported.
"""

from __future__ import annotations

from typing import Any

import torch.utils._pytree as pytree

from rectrain.sparse.jagged_tensor import JaggedTensor
from rectrain.sparse.keyed_jagged_tensor import KeyedJaggedTensor
from rectrain.sparse.keyed_tensor import KeyedTensor

_JT_FIELDS = ("_values", "_weights", "_lengths", "_offsets")
_KJT_FIELDS = ("_values", "_weights", "_lengths", "_offsets", "_inverse_indices_tensor")

Context = Any


def _jt_flatten(jt: JaggedTensor) -> tuple[list[Any], Context]:
    return [getattr(jt, f) for f in _JT_FIELDS], None


def _jt_unflatten(children: list[Any], context: Context) -> JaggedTensor:
    values, weights, lengths, offsets = children
    return JaggedTensor(values, weights, lengths, offsets, validate=False)


def _kjt_flatten(kjt: KeyedJaggedTensor) -> tuple[list[Any], Context]:
    inv = kjt.inverse_indices_or_none()
    children = [kjt.values(), kjt.weights_or_none(), kjt.lengths_or_none(), kjt.offsets_or_none()]
    children.append(None if inv is None else inv[1])
    spkpr = kjt._stride_per_key_per_rank
    context = (
        tuple(kjt.keys()),
        kjt._stride,
        None if spkpr is None else tuple(tuple(r) for r in spkpr),
        None if inv is None else tuple(inv[0]),
    )
    return children, context


def _kjt_unflatten(children: list[Any], context: Context) -> KeyedJaggedTensor:
    values, weights, lengths, offsets, inv_tensor = children
    keys, stride, spkpr, inv_keys = context
    return KeyedJaggedTensor(
        keys=list(keys),
        values=values,
        weights=weights,
        lengths=lengths,
        offsets=offsets,
        stride=stride,
        stride_per_key_per_rank=None if spkpr is None else [list(r) for r in spkpr],
        inverse_indices=None if inv_keys is None else (list(inv_keys), inv_tensor),
        validate=False,
    )


def _kt_flatten(kt: KeyedTensor) -> tuple[list[Any], Context]:
    return [kt.values()], (tuple(kt.keys()), tuple(kt.length_per_key()), kt.key_dim())


def _kt_unflatten(children: list[Any], context: Context) -> KeyedTensor:
    keys, length_per_key, key_dim = context
    return KeyedTensor(list(keys), list(length_per_key), children[0], key_dim=key_dim, validate=False)


def _with_keys(flatten, names):
    """A flatten_with_keys_fn that names each leaf by its field (for readable export graphs)."""

    def flatten_with_keys(node):
        children, context = flatten(node)
        return [(pytree.GetAttrKey(n.lstrip("_")), c) for n, c in zip(names, children)], context

    return flatten_with_keys


def register_sparse_pytrees() -> None:
    """Register JaggedTensor, KeyedJaggedTensor and KeyedTensor; a second call is a no-op."""
    nodes = [
        (JaggedTensor, _jt_flatten, _jt_unflatten, _JT_FIELDS),
        (KeyedJaggedTensor, _kjt_flatten, _kjt_unflatten, _KJT_FIELDS),
        (KeyedTensor, _kt_flatten, _kt_unflatten, ("_values",)),
    ]
    for cls, flatten, unflatten, names in nodes:
        if cls in pytree.SUPPORTED_NODES:
            continue
        pytree.register_pytree_node(
            cls,
            flatten,
            unflatten,
            serialized_type_name=f"{cls.__module__}.{cls.__name__}",
            flatten_with_keys_fn=_with_keys(flatten, names),
        )
