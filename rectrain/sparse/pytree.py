"""Registers the sparse types as ``torch.utils._pytree`` nodes, with TorchRec's leaves and contexts.

Tensors are the leaves, keys (and the per-key sizes of a KeyedTensor) the context, so ``torch.export``,
``tree_map`` and friends see through the types, and a program exported with one batch size runs with
another. The layouts follow TorchRec's, so specs and flattened lists mean the same thing in both:

- JaggedTensor: [values, weights, lengths, offsets]; no context.
- KeyedJaggedTensor: [values, weights, lengths, offsets, stride_per_key_per_rank, inverse indices tensor];
  context the keys (which also name the inverse indices' rows). Fewer leaves mean the trailing ones are None.
- KeyedTensor: [values]; context (keys, length_per_key), plus key_dim when it is not 1. Flattening a
  KeyedTensor against a spec of another key order (``torch.fx`` pytree) regroups it into that order.
"""

from __future__ import annotations

from typing import Any

import torch.fx._pytree as fx_pytree
import torch.utils._pytree as pytree
from torch import Tensor

from rectrain.sparse.jagged import JaggedTensor
from rectrain.sparse.keyed_jagged import KeyedJaggedTensor
from rectrain.sparse.keyed_tensor import KeyedTensor, permute_multi_embedding

_JT_FIELDS = ("_values", "_weights", "_lengths", "_offsets")
_KJT_FIELDS = ("_values", "_weights", "_lengths", "_offsets", "_stride_per_key_per_rank", "_inverse_indices")


def _jt_flatten(jt: JaggedTensor) -> tuple[list[Tensor | None], None]:
    return [getattr(jt, f) for f in _JT_FIELDS], None


def _jt_unflatten(leaves: list[Tensor | None], context: None) -> JaggedTensor:
    return JaggedTensor(*leaves)


def _kjt_flatten(kjt: KeyedJaggedTensor) -> tuple[list[Tensor | None], list[str]]:
    leaves = [getattr(kjt, f) for f in _KJT_FIELDS[:-1]]
    inverse = kjt.inverse_indices_or_none()
    leaves.append(None if inverse is None else inverse[1])
    return leaves, kjt.keys()


def _kjt_unflatten(leaves: list[Tensor | None], context: list[str]) -> KeyedJaggedTensor:
    if len(leaves) > len(_KJT_FIELDS):
        raise ValueError(
            f"a KeyedJaggedTensor has at most {len(_KJT_FIELDS)} leaves ({', '.join(_KJT_FIELDS)}), "
            f"got {len(leaves)}"
        )
    leaves = list(leaves) + [None] * (len(_KJT_FIELDS) - len(leaves))
    values, weights, lengths, offsets, per_rank, inverse = leaves
    return KeyedJaggedTensor(
        keys=list(context),
        values=values,
        weights=weights,
        lengths=lengths,
        offsets=offsets,
        stride_per_key_per_rank=per_rank,
        inverse_indices=None if inverse is None else (list(context), inverse),
    )


def _kt_flatten(kt: KeyedTensor) -> tuple[list[Tensor], tuple[Any, ...]]:
    context = (kt.keys(), kt.length_per_key())
    return [kt.values()], context if kt.key_dim() == 1 else (*context, kt.key_dim())


def _kt_unflatten(leaves: list[Tensor], context: tuple[Any, ...]) -> KeyedTensor:
    key_dim = context[2] if len(context) > 2 else 1
    return KeyedTensor(list(context[0]), list(context[1]), leaves[0], key_dim=key_dim)


def _kt_flatten_spec(kt: KeyedTensor, spec: pytree.TreeSpec) -> list[Tensor]:
    """``kt``'s values in the key order ``spec`` was made with (regrouped if ``kt`` holds them otherwise)."""
    keys = list(spec.context[0])
    if kt.keys() == keys:
        return [kt.values()]
    return [permute_multi_embedding([kt], [keys])[0]]


def _with_keys(flatten, names):
    """A flatten_with_keys_fn naming each leaf by its field (readable export graphs)."""

    def flatten_with_keys(node):
        leaves, context = flatten(node)
        return [(pytree.GetAttrKey(n.lstrip("_")), leaf) for n, leaf in zip(names, leaves)], context

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
    fx_pytree.register_pytree_flatten_spec(JaggedTensor, lambda jt, spec: _jt_flatten(jt)[0])
    fx_pytree.register_pytree_flatten_spec(KeyedJaggedTensor, lambda kjt, spec: _kjt_flatten(kjt)[0])
    fx_pytree.register_pytree_flatten_spec(KeyedTensor, _kt_flatten_spec)
