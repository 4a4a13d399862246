"""Sparse types: JaggedTensor, KeyedJaggedTensor and KeyedTensor (TorchRec-compatible API)."""

from rectrain.sparse.comparison import jt_is_equal, kjt_is_equal
from rectrain.sparse.jagged_tensor import JaggedTensor
from rectrain.sparse.keyed_jagged_tensor import KeyedJaggedTensor
from rectrain.sparse.keyed_tensor import KeyedTensor
from rectrain.sparse.pytree import register_sparse_pytrees

register_sparse_pytrees()

__all__ = ["JaggedTensor", "KeyedJaggedTensor", "KeyedTensor", "jt_is_equal", "kjt_is_equal"]
