"""KeyedJaggedTensor: every accessor and restructuring method, fixed and variable batch size per key."""

import pytest
import torch

from rectrain.errors import RecTrainError
from rectrain.sparse import JaggedTensor, KeyedJaggedTensor, jt_is_equal, kjt_is_equal

KEYS = ["user_features", "item_features"]


def seed_kjt(weighted: bool = False) -> KeyedJaggedTensor:
    values = torch.tensor([11, 12, 21, 22, 23, 24, 25, 26])
    return KeyedJaggedTensor(
        keys=KEYS,
        lengths=torch.tensor([2, 0, 1, 1, 1, 3]),
        values=values,
        weights=values.float() / 10 if weighted else None,
    )


def vbe_kjt() -> KeyedJaggedTensor:
    """Key a has 3 rows (2 on rank 0, 1 on rank 1), key b 1 row (rank 1), key c 2 rows (one per rank)."""
    return KeyedJaggedTensor(
        keys=["a", "b", "c"],
        values=torch.arange(7),
        weights=torch.arange(7, dtype=torch.float32),
        lengths=torch.tensor([2, 0, 1, 3, 0, 1]),
        stride_per_key_per_rank=[[2, 1], [0, 1], [1, 1]],
    )


def test_seed_example_getitem():
    jt = seed_kjt()["user_features"]
    assert jt.lengths().tolist() == [2, 0, 1] and jt.values().tolist() == [11, 12, 21]
    assert seed_kjt()["item_features"].values().tolist() == [22, 23, 24, 25, 26]
    with pytest.raises(KeyError, match="key nope is not in this KeyedJaggedTensor"):
        seed_kjt()["nope"]


def test_accessors_of_fixed_stride():
    kjt = seed_kjt(weighted=True)
    assert kjt.keys() == KEYS and len(kjt) == 2
    assert kjt.stride() == 3 and kjt.stride_per_key() == [3, 3]
    assert kjt.stride_per_key_per_rank() == []  # TorchRec's answer without a variable stride
    assert not kjt.variable_stride_per_key()
    assert kjt.length_per_key() == [3, 5] and kjt.offset_per_key() == [0, 3, 8]
    assert kjt.index_per_key() == {"user_features": 0, "item_features": 1}
    assert kjt.offsets().tolist() == [0, 2, 2, 3, 4, 5, 8]
    assert kjt.weights().tolist() == pytest.approx([1.1, 1.2, 2.1, 2.2, 2.3, 2.4, 2.5, 2.6])
    assert kjt.lengths_or_none() is not None and kjt.device() == torch.device("cpu")
    with pytest.raises(RecTrainError, match="no weights"):
        seed_kjt().weights()
    assert seed_kjt().weights_or_none() is None


def test_offsets_only_construction_computes_lengths():
    kjt = KeyedJaggedTensor(keys=KEYS, values=torch.arange(8), offsets=torch.tensor([0, 2, 2, 3, 4, 5, 8]))
    assert kjt.lengths_or_none() is None
    assert kjt.lengths().tolist() == [2, 0, 1, 1, 1, 3] and kjt.stride() == 3
    assert kjt.offsets_or_none() is not None


def test_accessors_of_variable_stride():
    kjt = vbe_kjt()
    assert kjt.variable_stride_per_key()
    assert kjt.stride_per_key() == [3, 1, 2] and kjt.stride() == 3
    assert kjt.stride_per_key_per_rank() == [[2, 1], [0, 1], [1, 1]]
    assert kjt.length_per_key() == [3, 3, 1]
    assert kjt["b"].lengths().tolist() == [3] and kjt["b"].values().tolist() == [3, 4, 5]
    assert kjt["c"].lengths().tolist() == [0, 1] and kjt["c"].weights().tolist() == [6.0]


def test_stride_per_key_is_a_cache_not_a_variable_stride():
    # As in TorchRec: stride_per_key caches per-key row counts; only stride_per_key_per_rank makes a VBE KJT.
    kjt = KeyedJaggedTensor(
        keys=["a", "b"], values=torch.arange(3), lengths=torch.tensor([1, 2]), stride_per_key=[1, 1]
    )
    assert kjt.stride_per_key() == [1, 1] and not kjt.variable_stride_per_key()


def test_to_dict_and_from_jt_dict_round_trip():
    kjt = seed_kjt(weighted=True)
    jts = kjt.to_dict()
    assert list(jts) == KEYS
    assert jts["item_features"].lengths().tolist() == [1, 1, 3]
    assert kjt_is_equal(KeyedJaggedTensor.from_jt_dict(jts), kjt)


def test_from_jt_dict_with_different_batch_sizes_is_vbe():
    jts = {
        "a": JaggedTensor(values=torch.tensor([1, 2]), lengths=torch.tensor([2])),
        "b": JaggedTensor(values=torch.tensor([3]), lengths=torch.tensor([0, 1])),
    }
    kjt = KeyedJaggedTensor.from_jt_dict(jts)
    assert kjt.variable_stride_per_key() and kjt.stride_per_key() == [1, 2]
    assert jt_is_equal(kjt["b"], jts["b"])


def test_split():
    kjt = seed_kjt(weighted=True)
    first, empty, second = kjt.split([1, 0, 1])
    assert first.keys() == ["user_features"] and first.lengths().tolist() == [2, 0, 1]
    assert second.values().tolist() == [22, 23, 24, 25, 26] and second.stride() == 3
    assert len(empty) == 0 and empty.stride() == 3 and empty.weights().numel() == 0
    assert kjt.split([2])[0] is kjt  # a segment of every key is the KJT itself, as in TorchRec


def test_split_of_vbe_keeps_per_key_strides():
    a, bc = vbe_kjt().split([1, 2])
    assert a.stride_per_key_per_rank() == [[2, 1]] and a.values().tolist() == [0, 1, 2]
    assert bc.stride_per_key() == [1, 2] and bc.lengths().tolist() == [3, 0, 1]
    assert a.stride() == bc.stride() == 3  # the parts keep the batch size of the whole
    assert bc.weights().tolist() == [3.0, 4.0, 5.0, 6.0]


def test_permute_reorders_and_drops_keys():
    kjt = seed_kjt(weighted=True)
    swapped = kjt.permute([1, 0])
    assert swapped.keys() == ["item_features", "user_features"]
    assert swapped.lengths().tolist() == [1, 1, 3, 2, 0, 1]
    assert swapped.values().tolist() == [22, 23, 24, 25, 26, 11, 12, 21]
    assert swapped.weights().tolist() == pytest.approx([2.2, 2.3, 2.4, 2.5, 2.6, 1.1, 1.2, 2.1])
    only = kjt.permute([1], indices_tensor=torch.tensor([1], dtype=torch.int32))
    assert only.keys() == ["item_features"] and only.values().tolist() == [22, 23, 24, 25, 26]
    twice = kjt.permute([1, 1])
    assert twice.keys() == ["item_features"] * 2 and twice.length_per_key() == [5, 5]
    assert twice.values().tolist() == [22, 23, 24, 25, 26] * 2


def test_permute_of_vbe():
    kjt = vbe_kjt().permute([2, 0, 1])
    assert kjt.keys() == ["c", "a", "b"] and kjt.stride_per_key_per_rank() == [[1, 1], [2, 1], [0, 1]]
    assert kjt.lengths().tolist() == [0, 1, 2, 0, 1, 3]
    assert kjt.values().tolist() == [6, 0, 1, 2, 3, 4, 5]
    assert kjt.weights().tolist() == [6.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_concat():
    kjt = seed_kjt()
    user, item = kjt.split([1, 1])
    assert kjt_is_equal(KeyedJaggedTensor.concat([user, item]), kjt)
    other = KeyedJaggedTensor(keys=["x"], values=torch.tensor([7]), lengths=torch.tensor([1]))
    mixed = KeyedJaggedTensor.concat([kjt, other])
    assert mixed.variable_stride_per_key() and mixed.stride_per_key() == [3, 3, 1]
    assert mixed["x"].values().tolist() == [7]
    with_no_keys = KeyedJaggedTensor.concat([KeyedJaggedTensor.empty(lengths_dtype=torch.int64), kjt])
    assert not with_no_keys.variable_stride_per_key() and with_no_keys.stride() == 3
    assert KeyedJaggedTensor.concat([kjt, user]).keys() == [*KEYS, "user_features"]  # repeats allowed
    with pytest.raises(ValueError, match="cannot concat weighted and unweighted"):
        KeyedJaggedTensor.concat([seed_kjt(weighted=True).split([1, 1])[0], item])
    with pytest.raises(ValueError, match="at least one"):
        KeyedJaggedTensor.concat([])


def test_sync_unsync_and_from_sync_constructors():
    kjt = KeyedJaggedTensor.from_lengths_sync(KEYS, torch.arange(8), torch.tensor([2, 0, 1, 1, 1, 3]))
    assert kjt._length_per_key == [3, 5] and kjt._offset_per_key == [0, 3, 8]
    assert kjt.unsync()._length_per_key is None and kjt.sync()._offset_per_key == [0, 3, 8]
    kjt2 = KeyedJaggedTensor.from_offsets_sync(KEYS, torch.arange(8), torch.tensor([0, 2, 2, 3, 4, 5, 8]))
    assert kjt_is_equal(kjt, kjt2) and kjt2._length_per_key == [3, 5]


def test_empty_and_empty_like():
    empty = KeyedJaggedTensor.empty(is_weighted=True)
    assert empty.keys() == [] and empty.stride() == 0 and empty.weights().numel() == 0
    assert empty.to_dict() == {} and str(empty) == "KeyedJaggedTensor()\n"
    like = KeyedJaggedTensor.empty_like(seed_kjt(weighted=True))
    assert like.keys() == [] and like.stride() == 3 and like.weights_or_none() is not None
    assert like.values().dtype == torch.int64
    vbe_like = KeyedJaggedTensor.empty_like(vbe_kjt())
    assert vbe_like.variable_stride_per_key() and vbe_like.stride_per_key_per_rank() == [
        [2, 1],
        [0, 1],
        [1, 1],
    ]


def test_inverse_indices():
    inv = torch.tensor([[0, 0, 1], [0, 1, 1]])
    kjt = KeyedJaggedTensor(
        keys=["a", "b"],
        values=torch.arange(3),
        lengths=torch.tensor([1, 1, 1]),
        stride_per_key_per_rank=[[2], [1]],
        inverse_indices=(["a", "b"], inv),
    )
    assert kjt.inverse_indices()[1] is inv and kjt.stride() == 3  # the batch is the inverse indices' width
    assert kjt.to("cpu").inverse_indices()[1].tolist() == inv.tolist()
    both = KeyedJaggedTensor.concat([kjt, kjt])
    assert both.inverse_indices()[0] == ["a", "b", "a", "b"] and both.inverse_indices()[1].shape == (4, 3)
    assert kjt.permute([1, 0]).inverse_indices_or_none() is None  # TorchRec drops them on permute
    assert seed_kjt().inverse_indices_or_none() is None
    with pytest.raises(ValueError, match="no inverse_indices"):
        seed_kjt().inverse_indices()


def test_to_cpu_dtype_size_and_str():
    kjt = seed_kjt(weighted=True)
    moved = kjt.to("cpu", dtype=torch.float64)
    assert moved.device() == torch.device("cpu") and moved.weights().dtype == torch.float64
    assert moved.values().dtype == torch.int64
    assert kjt.size_in_bytes() == 8 * 8 + 8 * 4 + 6 * 8
    assert str(seed_kjt()) == (
        'KeyedJaggedTensor({\n    "user_features": [[11, 12], [], [21]],\n'
        '    "item_features": [[22], [23], [24, 25, 26]]\n})\n'
    )
    assert '"weights": [[1.1' in str(kjt)


def test_kjt_is_equal_detects_differences():
    assert kjt_is_equal(seed_kjt(), seed_kjt())
    assert not kjt_is_equal(seed_kjt(), seed_kjt(weighted=True))
    assert not kjt_is_equal(seed_kjt(), seed_kjt().permute([1, 0]))
    assert not kjt_is_equal(seed_kjt(), None)
