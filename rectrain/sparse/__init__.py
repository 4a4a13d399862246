"""Sparse types: JaggedTensor, KeyedJaggedTensor and KeyedTensor, with TorchRec's API and behaviour.

``rectrain.sparse.jagged_tensor`` is the module TorchRec users know (``torchrec.sparse.jagged_tensor``):
every public name of TorchRec's is importable from there. Constructors do not check their input;
``validate()`` (or ``debug_checks()``) does.
"""

from rectrain.sparse.comparison import jt_is_equal, kjt_is_equal
from rectrain.sparse.conversions import ComputeJTDictToKJT, ComputeKJTToJTDict
from rectrain.sparse.jagged import JaggedTensor, JaggedTensorMeta
from rectrain.sparse.keyed_jagged import KeyedJaggedTensor
from rectrain.sparse.keyed_tensor import KeyedTensor, permute_multi_embedding, regroup_kts
from rectrain.sparse.pytree import register_sparse_pytrees
from rectrain.sparse.validation import checks_enabled, debug_checks

register_sparse_pytrees()

__all__ = [
    "ComputeJTDictToKJT",
    "ComputeKJTToJTDict",
    "JaggedTensor",
    "JaggedTensorMeta",
    "KeyedJaggedTensor",
    "KeyedTensor",
    "checks_enabled",
    "debug_checks",
    "jt_is_equal",
    "kjt_is_equal",
    "permute_multi_embedding",
    "regroup_kts",
]
