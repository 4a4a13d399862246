"""The behaviours TorchRec's own sparse-type tests check, re-expressed in our words (no TorchRec code here).

How the yardstick was measured: TorchRec's ``torchrec/sparse/tests/test_jagged_tensor.py``,
``test_keyed_jagged_tensor.py`` and ``test_keyed_tensor.py`` (meta-pytorch/torchrec at the v1.8.0-rc1 tag and
at main of Aug 2026) were copied to a scratch directory outside this repository, ``torchrec`` was replaced by
``rectrain`` in their text (imports and ``mock.patch`` targets) and they were run with pytest against this
package. Before this work the files did not import (no ``rectrain.sparse.jagged_tensor`` module, no
``rectrain.fx``); with stand-in modules for those imports 38 of their 112 CPU-runnable tests passed. Now
all 112 pass (23 more need CUDA and skip). This module,
``test_torchrec_tracing.py`` and ``test_torchrec_regroup.py`` keep those behaviours under our CI.

Data: ``FEATURES`` below is a batch of 3 examples and two features, ``a`` [[10, 11], [], [12]] and
``b`` [[13], [14], [15, 16, 17]], values 10..17 (floats where weights or padding are involved).
"""

import pytest
import torch

from rectrain.errors import RecTrainError
from rectrain.sparse.jagged_tensor import (
    ComputeJTDictToKJT,
    ComputeKJTToJTDict,
    JaggedTensor,
    KeyedJaggedTensor,
    jt_is_equal,
    kjt_is_equal,
)

T = torch.tensor
IDS = T([10, 11, 12, 13, 14, 15, 16, 17])
W = T([0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0])
OFFSETS = T([0, 2, 2, 3, 4, 5, 8], dtype=torch.int32)


def features(weighted: bool = False, **kwargs) -> KeyedJaggedTensor:
    return KeyedJaggedTensor(
        keys=["a", "b"], values=IDS, offsets=OFFSETS, weights=W if weighted else None, **kwargs
    )


# ---------------------------------------------------------------------------------------------- JaggedTensor


def test_values_past_the_last_row_are_ignored():
    jt = JaggedTensor(values=T([1.0, 2.0, 3.0, 99.0]), lengths=T([2, 0, 1], dtype=torch.int32))
    assert jt.to_padded_dense().tolist() == [[1, 2], [0, 0], [3, 0]]
    assert [row.tolist() for row in jt.to_dense()] == [[1, 2], [], [3]]


def test_two_dimensional_values():
    rows = torch.arange(12).view(4, 3)
    jt = JaggedTensor(values=rows, offsets=T([0, 2, 2, 3]))  # the fourth row is a tail
    assert jt.lengths().tolist() == [2, 0, 1]
    padded = jt.to_padded_dense(desired_length=2)
    assert (
        padded.shape == (3, 2, 3)
        and padded.dtype == torch.int64
        and padded[2].tolist() == [[6, 7, 8], [0, 0, 0]]
    )
    assert (
        str(JaggedTensor(values=rows[:2], lengths=T([2])))
        == "JaggedTensor({\n    [[[0, 1, 2], [3, 4, 5]]]\n})\n"
    )
    with pytest.raises(ValueError, match="cannot print values of 3 dimensions"):
        str(JaggedTensor(values=torch.zeros(1, 1, 1), lengths=T([1])))


def test_to_padded_dense_pads_truncates_and_pads_weights():
    jt = JaggedTensor(values=IDS.float(), weights=W, offsets=OFFSETS)
    assert jt.to_padded_dense(desired_length=2, padding_value=-1.0)[1].tolist() == [-1, -1]
    assert jt.to_padded_dense()[5].tolist() == [15, 16, 17]
    assert jt.to_padded_dense_weights(desired_length=1).flatten().tolist() == [0.5, 0, 1.5, 2.0, 2.5, 3.0]
    assert JaggedTensor(values=IDS, offsets=OFFSETS).to_padded_dense_weights() is None


def test_from_dense_and_from_dense_lengths():
    jt = JaggedTensor.from_dense([T([1.0]), T([]), T([2.0, 3.0])], weights=[T([0.1]), T([]), T([0.2, 0.3])])
    assert jt.lengths().dtype == torch.int32 and jt.offsets().tolist() == [0, 1, 1, 3]
    dense = T([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    picked = JaggedTensor.from_dense_lengths(dense, T([2, 1], dtype=torch.int32), weights=dense * 10)
    assert picked.values().tolist() == [1, 2, 4] and picked.weights().tolist() == [10, 20, 40]
    by_rows = JaggedTensor.from_dense([T([1.0, 2.0]), T([4.0])])
    assert jt_is_equal(by_rows, JaggedTensor(T([1.0, 2.0, 4.0]), lengths=T([2, 1], dtype=torch.int32)))


def test_empty_and_empty_like():
    jt = JaggedTensor.empty(values_dtype=torch.int64)
    assert jt.offsets().tolist() == [] and jt.offsets().dtype == torch.int32 and jt.to_dense() == []
    like = JaggedTensor.empty_like(JaggedTensor(values=W, weights=W.double(), lengths=T([8])))
    assert like.values().numel() == 0 and like.weights().dtype == torch.float64


def test_non_integer_lengths_or_offsets_are_refused():
    with pytest.raises(AssertionError, match="lengths must be of integer type"):
        JaggedTensor(values=torch.rand(7, 3), lengths=T([3.0, 4.0]))
    with pytest.raises(AssertionError, match="offsets must be of integer type"):
        KeyedJaggedTensor.from_offsets_sync(keys=["a"], values=torch.rand(7), offsets=T([0.0, 7.0]))
    JaggedTensor(values=T([]), lengths=T([]))  # an empty float tensor means no rows and is accepted


def test_size_in_bytes_counts_what_is_held():
    assert JaggedTensor(values=W, lengths=T([8], dtype=torch.int32)).size_in_bytes() == 8 * 4 + 4
    assert JaggedTensor(values=W, weights=W, offsets=OFFSETS).size_in_bytes() == 8 * 4 * 2 + 7 * 4


def test_copy_in_place():
    target = JaggedTensor(
        values=torch.zeros(3), weights=torch.zeros(3), lengths=torch.zeros(2, dtype=torch.int64)
    )
    source = JaggedTensor(values=T([1.0, 2.0, 3.0]), weights=T([4.0, 5.0, 6.0]), lengths=T([1, 2]))
    assert target.copy_(source) is target
    assert target.values().tolist() == [1, 2, 3] and target.lengths().tolist() == [1, 2]


def test_jt_equality():
    jt = JaggedTensor(values=W, lengths=T([2, 0, 6]))
    assert jt_is_equal(jt, JaggedTensor(values=W, offsets=T([0, 2, 2, 8])))
    assert not jt_is_equal(jt, JaggedTensor(values=W, lengths=T([2, 1, 5])))
    assert not jt_is_equal(jt, JaggedTensor(values=W, weights=W, lengths=T([2, 0, 6])))
    assert not jt_is_equal(jt, "a string")


# ----------------------------------------------------------------------------------------- KeyedJaggedTensor


def test_lookup_and_dict_view_with_fixed_and_variable_batch():
    fixed = features(weighted=True)
    assert fixed["a"].lengths().tolist() == [2, 0, 1] and fixed["b"].weights().tolist() == [
        2.0,
        2.5,
        3.0,
        3.5,
        4.0,
    ]
    vbe = features(stride_per_key_per_rank=[[2], [4]])  # a: 2 rows, b: 4 rows
    assert vbe["a"].values().tolist() == [10, 11] and vbe["b"].lengths().tolist() == [1, 1, 1, 3]
    parts = vbe.to_dict(compute_offsets=False)
    assert parts["b"].offsets_or_none() is None and parts["b"].lengths().tolist() == [1, 1, 1, 3]


def test_empty_and_keyless_kjts():
    one_key = KeyedJaggedTensor(keys=["a"], values=T([]), lengths=T([]))
    no_rows = KeyedJaggedTensor(keys=["b"], values=T([]), offsets=T([]))  # empty offsets: no rows
    both = KeyedJaggedTensor.concat([one_key, no_rows])
    assert both["a"].values().numel() == 0 and both["b"].lengths().numel() == 0
    assert KeyedJaggedTensor.empty().to_dict() == {}
    keyless = KeyedJaggedTensor(keys=[], values=T([]), offsets=T([], dtype=torch.int32))
    assert kjt_is_equal(keyless, keyless) and str(KeyedJaggedTensor([], T([]))) == "KeyedJaggedTensor()\n"
    two_keys_no_rows = KeyedJaggedTensor(
        keys=["a", "b"], values=T([]), lengths=T([[], []]), length_per_key=[0, 0]
    )
    assert [jt.offsets().numel() for jt in two_keys_no_rows.to_dict().values()] == [0, 0]
    vbe_no_rows = KeyedJaggedTensor(keys=["a"], values=T([]), lengths=T([]), stride_per_key_per_rank=[[]])
    assert vbe_no_rows.stride() == 0


def test_split_keeps_the_batch_size_even_with_variable_strides():
    kjt = KeyedJaggedTensor(
        keys=["a", "b", "c", "d"],
        values=torch.arange(10.0),
        lengths=T([2, 0, 1, 1, 1, 3, 0, 2], dtype=torch.int32),
        stride_per_key_per_rank=[[3], [0], [1], [4]],
    )
    first, nothing, last = kjt.split([1, 2, 1])[0], kjt.split([0, 4])[0], kjt.split([3, 1])[1]
    assert first.lengths().tolist() == [2, 0, 1] and first.stride() == 4
    assert nothing.keys() == [] and nothing.stride() == 4
    assert last.lengths().tolist() == [1, 3, 0, 2] and last.values().tolist() == [4, 5, 6, 7, 8, 9]
    whole = features()
    assert whole.split([0, 2])[1] is whole and whole.split([0, 2])[0].stride() == 3


def test_permute_with_repeated_keys_fixed_and_variable_batch():
    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b", "c"], values=IDS, lengths=T([0, 2, 0, 1, 1, 1, 0, 3, 0], dtype=torch.int32)
    )
    out = kjt.permute([1, 0, 1])
    assert out.keys() == ["b", "a", "b"] and out.offset_per_key() == [0, 3, 5, 8]
    assert out.values().tolist() == [12, 13, 14, 10, 11, 12, 13, 14]
    vbe = KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b", "c"],
        values=IDS,
        lengths=T([1, 0, 1, 3, 0, 1, 0, 2, 0], dtype=torch.int32),
        stride_per_key_per_rank=[[2], [4], [3]],
    )
    twice = vbe.permute([2, 2, 0])
    assert twice.keys() == ["c", "c", "a"] and twice.stride_per_key() == [3, 3, 2]
    assert twice.lengths().tolist() == [0, 2, 0, 0, 2, 0, 1, 0]
    assert twice.values().tolist() == [16, 17, 16, 17, 10]


def test_concat_and_from_jt_dict():
    kjt = features(weighted=True)
    a, b = kjt.split([1, 1])
    joined = KeyedJaggedTensor.concat([a.sync(), b.sync()])
    assert kjt_is_equal(joined, kjt) and joined.length_per_key_or_none() == [3, 5]
    rebuilt = KeyedJaggedTensor.from_jt_dict(kjt.to_dict())
    assert kjt_is_equal(rebuilt, kjt) and rebuilt._stride_per_key_per_rank is None
    forced = KeyedJaggedTensor.from_jt_dict(kjt.to_dict(), force_variable_stride=True)
    assert forced._stride_per_key_per_rank.tolist() == [[3], [3]] and forced.variable_stride_per_key()


def test_lengths_and_offsets_construction_agree():
    by_offsets = KeyedJaggedTensor.from_offsets_sync(keys=["a", "b"], values=IDS, offsets=OFFSETS)
    by_lengths = KeyedJaggedTensor.from_lengths_sync(
        keys=["a", "b"], values=IDS, lengths=T([2, 0, 1, 1, 1, 3])
    )
    assert by_offsets.lengths().tolist() == by_lengths.lengths().tolist() and kjt_is_equal(
        by_offsets, by_lengths
    )
    assert not kjt_is_equal(by_offsets, KeyedJaggedTensor(keys=["b", "a"], values=IDS, offsets=OFFSETS))
    assert not kjt_is_equal(by_offsets, features(length_per_key=[4, 4], offset_per_key=[0, 4, 8]))


def test_variable_batch_size_follows_the_inverse_indices():
    inverse = T([[0, 1, 0], [0, 0, 0]])
    kjt = KeyedJaggedTensor(
        keys=["a", "b", "c"],
        values=T([5, 6, 7, 1, 2, 3, 0, 1]),
        lengths=T([3, 3, 2]),
        stride_per_key_per_rank=[[2], [1]],
        inverse_indices=(["a", "b"], inverse),
    )
    assert kjt.stride() == 3


def test_to_pin_memory_and_dtype():
    kjt = features(weighted=True, stride_per_key_per_rank=[[3], [3]])
    moved = kjt.to(torch.device("cpu"), dtype=torch.float64)
    assert moved.weights().dtype == torch.float64 and moved.values().dtype == torch.int64
    assert moved.stride_per_key_per_rank() == [[3], [3]]
    if torch.cuda.is_available():  # pinning needs a CUDA driver
        assert kjt.pin_memory().values().is_pinned()


def test_strings():
    assert str(features()) == (
        'KeyedJaggedTensor({\n    "a": [[10, 11], [], [12]],\n    "b": [[13], [14], [15, 16, 17]]\n})\n'
    )
    vbe = features(weighted=True, stride_per_key_per_rank=[[1, 1], [1, 3]])
    assert str(vbe).startswith(
        'KeyedJaggedTensor({\n    "a": {\n        "values": [[10, 11], []],\n'
        '        "weights": [[0.5, 1.0], []]\n    },'
    )


def test_empty_like_keeps_strides_and_weights():
    like = KeyedJaggedTensor.empty_like(features(weighted=True))
    assert like.keys() == [] and like.stride() == 3 and like.weights().dtype == torch.float32
    assert like._stride_per_key_per_rank is None
    vbe_like = KeyedJaggedTensor.empty_like(features(stride_per_key_per_rank=[[2], [4]]))
    assert vbe_like.variable_stride_per_key() and vbe_like.stride_per_key_per_rank() == [[2], [4]]


def test_meta_tensors_flow_through_without_data():
    meta = torch.device("meta")
    kjt = KeyedJaggedTensor(
        keys=["a", "b"],
        values=torch.empty(10, device=meta),
        lengths=torch.empty(4, dtype=torch.int64, device=meta),
    )
    kjt.sync()
    assert kjt.length_per_key() == [5, 5]
    assert KeyedJaggedTensor.from_jt_dict(kjt.to_dict()).device() == meta


def test_clear_storage_releases_the_tensors():
    kjt = KeyedJaggedTensor(keys=["a", "b"], values=IDS.clone(), offsets=OFFSETS.clone(), weights=W.clone())
    freed = kjt.clear_storage()
    assert freed == 8 * 8 + 8 * 4 + 7 * 4 and kjt.values().untyped_storage().nbytes() == 0


def test_conversion_modules():
    kjt = KeyedJaggedTensor.from_offsets_sync(
        keys=["a", "b"],
        values=W,
        weights=W * 2,
        offsets=T([0, 0, 2, 2, 3, 4, 5, 5, 8], dtype=torch.int32),
        stride_per_key_per_rank=[[0, 2], [3, 3]],
    )
    jts = ComputeKJTToJTDict()(kjt)
    assert jts["a"].offsets().tolist() == [0, 0, 2] and jts["b"].lengths().tolist() == [0, 1, 1, 1, 0, 3]
    back = ComputeJTDictToKJT()(jts)
    assert back.stride_per_key() == [2, 6] and back["b"].weights().tolist() == (W[2:] * 2).tolist()


def test_weights_of_an_unweighted_kjt_is_an_error():
    with pytest.raises(RecTrainError, match="no weights"):
        features().weights()


def test_tensor_dict_conversion_passes_kjts_through():
    from rectrain.sparse.tensor_dict import maybe_td_to_kjt

    kjt = features()
    assert maybe_td_to_kjt(kjt) is kjt
