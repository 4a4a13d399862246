"""``make_batch`` is where dataset rows become a KJT: it validates them (the KJT constructor does not)."""

import pytest
import torch

from rectrain.datasets.batching import make_batch

T = torch.tensor


def test_well_formed_rows_become_a_synced_kjt():
    batch = make_batch(
        torch.zeros(2, 1), ["a", "b"], [T([1, 2]), T([3])], [T([2, 0]), T([0, 1])], T([0.0, 1.0])
    )
    kjt = batch.sparse_features
    assert kjt.keys() == ["a", "b"] and kjt.length_per_key_or_none() == [2, 1]
    assert kjt["b"].lengths().tolist() == [0, 1] and kjt["b"].values().tolist() == [3]


@pytest.mark.parametrize(
    ("values", "lengths", "message"),
    [
        ([T([1, 2]), T([3])], [T([2, 0]), T([0, 2])], "lengths sum to 4 but values has 3 elements"),
        ([T([1, 2]), T([3])], [T([2, 0]), T([2, -1])], r"non-negative but 1 entries are negative"),
        (
            [T([1, 2]), T([3])],
            [T([2, 0, 0]), T([1, 0])],
            r"lengths \(5\) is not divisible by the number of keys",
        ),
    ],
)
def test_malformed_rows_are_rejected_naming_the_problem(values, lengths, message):
    with pytest.raises(ValueError, match=message):
        make_batch(torch.zeros(2, 1), ["a", "b"], values, lengths, T([0.0, 1.0]))
