"""JaggedTensor: construction, conversions, device moves and the round-trip properties."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rectrain.errors import RecTrainError
from rectrain.sparse import JaggedTensor, jt_is_equal

VALUES = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])


def seed_jt(**kwargs) -> JaggedTensor:
    return JaggedTensor(lengths=torch.tensor([2, 3, 1]), values=VALUES, **kwargs)


def test_seed_example_lengths_and_offsets_agree():
    jt = seed_jt()
    jt2 = JaggedTensor(offsets=torch.tensor([0, 2, 5, 6]), values=VALUES)
    assert jt.offsets().tolist() == [0, 2, 5, 6]
    assert jt2.lengths().tolist() == [2, 3, 1]
    assert jt_is_equal(jt, jt2)


def test_offsets_are_computed_lazily_and_cached():
    jt = seed_jt()
    assert jt.offsets_or_none() is None
    offsets = jt.offsets()
    assert jt.offsets_or_none() is offsets
    assert jt.lengths_or_none().tolist() == [2, 3, 1]


def test_weights_accessors():
    weights = torch.arange(6, dtype=torch.float32)
    jt = seed_jt(weights=weights)
    assert jt.weights() is weights and jt.weights_or_none() is weights
    unweighted = seed_jt()
    assert unweighted.weights_or_none() is None
    with pytest.raises(RecTrainError, match="no weights"):
        unweighted.weights()


def test_to_dense_and_weights():
    jt = seed_jt(weights=VALUES * 10)
    assert [t.tolist() for t in jt.to_dense()] == [[1.0, 2.0], [3.0, 4.0, 5.0], [6.0]]
    assert [t.tolist() for t in jt.to_dense_weights()] == [[10.0, 20.0], [30.0, 40.0, 50.0], [60.0]]
    assert seed_jt().to_dense_weights() is None


def test_to_padded_dense_pads_and_truncates():
    jt = seed_jt(weights=VALUES * 10)
    assert jt.to_padded_dense().tolist() == [[1, 2, 0], [3, 4, 5], [6, 0, 0]]
    assert jt.to_padded_dense(desired_length=2, padding_value=-1.0).tolist() == [[1, 2], [3, 4], [6, -1]]
    assert jt.to_padded_dense_weights(desired_length=1).tolist() == [[10], [30], [60]]
    assert seed_jt().to_padded_dense_weights() is None


def test_to_padded_dense_of_embeddings_keeps_trailing_dims():
    values = torch.arange(12, dtype=torch.float32).view(6, 2)
    dense = JaggedTensor(values=values, lengths=torch.tensor([2, 3, 1])).to_padded_dense()
    assert dense.shape == (3, 3, 2)
    assert dense[2].tolist() == [[10, 11], [0, 0], [0, 0]]


def test_from_dense_and_from_dense_lengths():
    jt = JaggedTensor.from_dense(
        [torch.tensor([1.0, 2.0]), torch.tensor([]), torch.tensor([3.0])],
        weights=[torch.tensor([0.5, 0.5]), torch.tensor([]), torch.tensor([1.0])],
    )
    assert jt.lengths().tolist() == [2, 0, 1] and jt.values().tolist() == [1, 2, 3]
    assert jt.weights().tolist() == [0.5, 0.5, 1.0]
    dense = torch.tensor([[1, 2, 3], [4, 5, 6]])
    jt2 = JaggedTensor.from_dense_lengths(dense, torch.tensor([1, 3]), weights=dense * 2)
    assert jt2.values().tolist() == [1, 4, 5, 6] and jt2.weights().tolist() == [2, 8, 10, 12]


def test_empty():
    jt = JaggedTensor.empty(is_weighted=True, values_dtype=torch.int64)
    assert jt.values().numel() == 0 and jt.lengths().numel() == 0 and jt.offsets().numel() == 0
    assert jt.weights().numel() == 0 and jt.values().dtype == torch.int64
    assert jt.offsets().dtype == torch.int32 and jt.to_dense() == []
    no_rows = JaggedTensor.from_dense([])
    assert no_rows.offsets().tolist() == [0] and no_rows.to_padded_dense().shape == (0, 0)


def test_empty_like_keeps_dtypes():
    like = JaggedTensor.empty_like(seed_jt(weights=VALUES.double()))
    assert like.values().numel() == 0 and like.values().dtype == torch.float32
    assert like.weights().dtype == torch.float64 and like.lengths().dtype == torch.int64


def test_to_cpu_device_size_and_str():
    jt = seed_jt(weights=VALUES)
    assert jt.size_in_bytes() == 6 * 4 + 6 * 4 + 3 * 8  # values, weights, lengths (no offsets yet)
    moved = jt.to("cpu")
    assert moved.device() == torch.device("cpu") and jt_is_equal(moved, jt)
    assert str(jt) == (
        'JaggedTensor({\n    "values": [[1.0, 2.0], [3.0, 4.0, 5.0], [6.0]],\n'
        '    "weights": [[1.0, 2.0], [3.0, 4.0, 5.0], [6.0]]\n})\n'
    )
    assert repr(seed_jt()) == "JaggedTensor({\n    [[1.0, 2.0], [3.0, 4.0, 5.0], [6.0]]\n})\n"


def test_jt_is_equal_detects_differences():
    jt = seed_jt()
    assert not jt_is_equal(jt, JaggedTensor(lengths=torch.tensor([3, 2, 1]), values=VALUES))
    assert not jt_is_equal(jt, seed_jt(weights=VALUES))
    assert not jt_is_equal(jt, "not a jagged tensor")


row_lists = st.lists(st.lists(st.floats(-100, 100, width=32), max_size=5), max_size=6)


@given(rows=row_lists)
def test_dense_jagged_round_trip(rows):
    jt = JaggedTensor.from_dense([torch.tensor(r, dtype=torch.float32) for r in rows])
    assert [t.tolist() for t in jt.to_dense()] == rows
    width = max((len(r) for r in rows), default=0)
    padded = jt.to_padded_dense(padding_value=-1000.0)
    assert padded.tolist() == [r + [-1000.0] * (width - len(r)) for r in rows]
    back = JaggedTensor.from_dense_lengths(padded.view(len(rows), width), jt.lengths())
    assert jt_is_equal(back, jt)


@given(rows=row_lists, desired=st.integers(0, 6))
def test_to_padded_dense_matches_reference(rows, desired):
    jt = JaggedTensor.from_dense([torch.tensor(r, dtype=torch.float32) for r in rows])
    expected = [(r + [0.0] * desired)[:desired] for r in rows]
    assert jt.to_padded_dense(desired_length=desired).tolist() == expected
