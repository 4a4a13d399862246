"""Every kind of malformed input is rejected with a message naming the argument and the numbers."""

import pytest
import torch

from rectrain.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor

T = torch.tensor


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lengths": T([2, 3, 2])}, "lengths sum to 7 but values has 6 elements"),
        ({"lengths": T([4, -1, 3])}, r"non-negative but 1 entries are negative \(smallest -1\)"),
        ({"offsets": T([1, 2, 6])}, r"offsets must start at 0 but offsets\[0\] is 1"),
        ({"offsets": T([0, 4, 2, 6])}, "offsets must be non-decreasing but decrease at 1 positions"),
        ({"offsets": T([0, 2, 5])}, "offsets end at 5 but values has 6 elements"),
        ({"offsets": T([], dtype=torch.int64)}, "offsets must have at least one element"),
        ({"lengths": T([3, 3]), "offsets": T([0, 3])}, r"offsets must have len\(lengths\) \+ 1 elements"),
        ({"lengths": T([3, 3]), "offsets": T([0, 2, 6])}, "lengths and offsets disagree at 2 positions"),
        ({"lengths": T([[3, 3]])}, r"lengths must be 1-D but has shape \(1, 2\)"),
        ({"lengths": T([6]), "weights": torch.ones(5)}, "weights has 5 elements but values has 6"),
        ({}, "needs lengths or offsets"),
    ],
)
def test_jagged_tensor_rejects(kwargs, message):
    with pytest.raises(ValueError, match=message):
        JaggedTensor(values=torch.arange(6), **kwargs)


def test_validation_can_be_switched_off():
    jt = JaggedTensor(values=torch.arange(6), lengths=T([2, 3, 2]), validate=False)
    assert jt.lengths().tolist() == [2, 3, 2]
    kjt = KeyedJaggedTensor(keys=["a", "a"], values=torch.arange(3), lengths=T([1, 2]), validate=False)
    assert kjt.keys() == ["a", "a"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"keys": ["a", "b", "a"], "lengths": T([1, 1, 1])}, r"keys must be unique but \['a'\] appear more"),
        ({"lengths": T([1, 1, 1])}, r"number of lengths \(3\) is not divisible by the number of keys \(2\)"),
        ({"lengths": T([1, 1, 1, 0]), "stride": 3}, r"must equal stride \* number of keys = 3 \* 2"),
        (
            {"lengths": T([1, 1, 1]), "stride_per_key_per_rank": [[1], [1]]},
            r"number of lengths \(3\) must equal the sum of the per-key strides \[1, 1\] = 2",
        ),
        (
            {"lengths": T([3]), "stride_per_key_per_rank": [[1]]},
            "stride_per_key_per_rank must have one entry per key: got 1 for 2 keys",
        ),
        ({"lengths": T([1, 1, 1, 1])}, "lengths sum to 4 but values has 3 elements"),
        ({"lengths": T([1, 2]), "weights": torch.ones(2)}, "weights has 2 elements but values has 3"),
        ({"lengths": T([1, 2]), "length_per_key": [1, 1]}, r"length_per_key \[1, 1\] must have 2 entries"),
        ({"lengths": T([1, 2]), "offset_per_key": [0, 3]}, r"offset_per_key \[0, 3\] must have 3 entries"),
        (
            {"lengths": T([1, 2]), "inverse_indices": (["a", "b"], T([0, 1]))},
            r"inverse_indices tensor must be \[num_keys, batch\] with 2 rows, got shape \(2,\)",
        ),
        (
            {"lengths": T([1, 2]), "stride_per_key": [1, 1], "stride_per_key_per_rank": [[1], [1]]},
            "not both",
        ),
        ({}, "needs lengths or offsets"),
    ],
)
def test_keyed_jagged_tensor_rejects(kwargs, message):
    kwargs = {"keys": ["a", "b"], **kwargs}
    with pytest.raises(ValueError, match=message):
        KeyedJaggedTensor(values=torch.arange(3), **kwargs)


def test_keyed_jagged_tensor_rejects_2d_values():
    with pytest.raises(ValueError, match=r"values must be 1-D but has shape \(2, 1\)"):
        KeyedJaggedTensor(keys=["a"], values=torch.zeros(2, 1), lengths=T([2]))


def test_keys_without_rows_need_empty_lengths():
    with pytest.raises(ValueError, match="keys is empty but lengths has 1 elements"):
        KeyedJaggedTensor(keys=[], values=torch.arange(1), lengths=T([1]))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((["a", "a"], [1, 1]), r"keys must be unique but \['a'\]"),
        ((["a"], [1, 1]), "length_per_key has 2 entries for 1 keys"),
        ((["a", "b"], [1, 2]), "length_per_key sums to 3 but values has 2 entries along key_dim 1"),
        ((["a", "b"], [-1, 3]), r"length_per_key must be non-negative, got \[-1, 3\]"),
    ],
)
def test_keyed_tensor_rejects(args, message):
    with pytest.raises(ValueError, match=message):
        KeyedTensor(*args, values=torch.zeros(4, 2))


def test_keyed_tensor_rejects_bad_key_dim():
    with pytest.raises(ValueError, match=r"key_dim 2 is out of range for values of shape \(4, 2\)"):
        KeyedTensor(["a"], [2], torch.zeros(4, 2), key_dim=2)


def test_from_dense_lengths_rejects_mismatched_shapes():
    with pytest.raises(ValueError, match=r"got values \(2, 3\) and lengths \(3,\)"):
        JaggedTensor.from_dense_lengths(torch.zeros(2, 3), T([1, 1, 1]))
    with pytest.raises(ValueError, match="desired_length must be non-negative, got -1"):
        JaggedTensor(values=torch.arange(2), lengths=T([2])).to_padded_dense(desired_length=-1)
