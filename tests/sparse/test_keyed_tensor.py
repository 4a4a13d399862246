"""KeyedTensor: per-key views, regrouping and device moves."""

import pytest
import torch

from rectrain.sparse import KeyedTensor


def pooled() -> KeyedTensor:
    """Batch of 2; key a has dim 2, key b dim 1, key c dim 3."""
    values = torch.arange(12, dtype=torch.float32).view(2, 6)
    return KeyedTensor(keys=["a", "b", "c"], length_per_key=[2, 1, 3], values=values)


def test_accessors_and_getitem():
    kt = pooled()
    assert kt.keys() == ["a", "b", "c"] and kt.key_dim() == 1
    assert kt.length_per_key() == [2, 1, 3] and kt.offset_per_key() == [0, 2, 3, 6]
    assert kt.values().shape == (2, 6) and kt.device() == torch.device("cpu")
    assert kt["b"].tolist() == [[2.0], [8.0]]
    assert kt["c"].tolist() == [[3.0, 4.0, 5.0], [9.0, 10.0, 11.0]]
    with pytest.raises(KeyError, match="key z is not in this KeyedTensor"):
        kt["z"]


def test_to_dict_and_from_tensor_list_round_trip():
    kt = pooled()
    parts = kt.to_dict()
    assert list(parts) == ["a", "b", "c"] and parts["a"].shape == (2, 2)
    rebuilt = KeyedTensor.from_tensor_list(list(parts), list(parts.values()))
    assert rebuilt.length_per_key() == [2, 1, 3] and torch.equal(rebuilt.values(), kt.values())


def test_key_dim_zero():
    kt = KeyedTensor.from_tensor_list(["x", "y"], [torch.ones(1, 3), torch.zeros(2, 3)], key_dim=0, cat_dim=0)
    assert kt.length_per_key() == [1, 2] and kt["y"].shape == (2, 3)


def test_regroup_and_regroup_as_dict():
    kt = pooled()
    other = KeyedTensor(keys=["d"], length_per_key=[1], values=torch.tensor([[100.0], [200.0]]))
    groups = KeyedTensor.regroup([kt, other], [["c", "d"], ["a"]])
    assert groups[0].tolist() == [[3, 4, 5, 100], [9, 10, 11, 200]]
    assert torch.equal(groups[1], kt["a"])
    named = KeyedTensor.regroup_as_dict([kt, other], [["b", "a"]], ["ba"])
    assert named["ba"].tolist() == [[2, 0, 1], [8, 6, 7]]
    repeated = KeyedTensor.regroup([kt], [["a", "a"], ["c"]])  # a key may appear in several groups
    assert repeated[0].tolist() == [[0, 1, 0, 1], [6, 7, 6, 7]]
    with pytest.raises(ValueError, match="key zz is not in any KeyedTensor"):
        KeyedTensor.regroup([kt], [["a", "zz"], ["a"]])
    with pytest.raises(ValueError, match="got 1 groups but 2 keys"):
        KeyedTensor.regroup_as_dict([kt], [["a"]], ["x", "y"])


def test_regroup_gradients_flow_to_inputs():
    values = torch.randn(2, 3, requires_grad=True)
    kt = KeyedTensor(["a", "b"], [1, 2], values)
    (out,) = KeyedTensor.regroup([kt], [["b", "a"]])
    out.sum().backward()
    assert torch.equal(values.grad, torch.ones(2, 3))


def test_to_cpu_and_str():
    kt = pooled()
    moved = kt.to("cpu")
    assert moved.device() == torch.device("cpu") and torch.equal(moved.values(), kt.values())
    assert str(KeyedTensor(["a"], [1], torch.tensor([[1.0]]))) == 'KeyedTensor({\n    "a": [[1.0]]\n})\n'
