"""Checking is explicit: constructors accept what TorchRec's accept; ``validate()`` (or the debug switch)
rejects malformed data with a message naming the argument and the numbers."""

import logging
import subprocess
import sys

import pytest
import torch

from rectrain.modules.embedding_configs import EmbeddingBagConfig
from rectrain.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor, checks_enabled, debug_checks
from rectrain.sparse.jagged_tensor_validator import validate_keyed_jagged_tensor

T = torch.tensor

JT_CASES = [
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
]


@pytest.mark.parametrize(("kwargs", "message"), JT_CASES)
def test_jagged_tensor_accepts_then_validate_rejects(kwargs, message):
    jt = JaggedTensor(values=torch.arange(6), **kwargs)  # the constructor reads no data
    with pytest.raises(ValueError, match=message):
        jt.validate()
    with pytest.raises(ValueError, match=message):
        JaggedTensor(values=torch.arange(6), validate=True, **kwargs)


def test_constructors_keep_their_structural_assertions():
    with pytest.raises(ValueError, match="needs lengths or offsets"):
        JaggedTensor(values=torch.arange(2))
    with pytest.raises(AssertionError, match="lengths must be of integer type"):
        JaggedTensor(values=torch.arange(2), lengths=T([1.0, 1.0]))
    with pytest.raises(AssertionError, match="offsets must be of integer type"):
        KeyedJaggedTensor(keys=["a"], values=torch.arange(2), offsets=T([0.0, 2.0]))


KJT_CASES = [
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
    ({"keys": [], "lengths": T([3])}, "keys is empty but lengths or offsets is not"),
    ({}, "lengths and offsets cannot be both empty"),
]


@pytest.mark.parametrize(("kwargs", "message"), KJT_CASES)
def test_keyed_jagged_tensor_accepts_then_validate_rejects(kwargs, message):
    kwargs = {"keys": ["a", "b"], **kwargs}
    kjt = KeyedJaggedTensor(values=torch.arange(3), **kwargs)
    with pytest.raises(ValueError, match=message):
        kjt.validate()


def test_validate_accepts_well_formed_input_and_returns_it():
    kjt = KeyedJaggedTensor(keys=["a", "b"], values=torch.zeros(3, 2), lengths=T([1, 2]))  # 2-D values
    assert kjt.validate() is kjt
    vbe = KeyedJaggedTensor(
        keys=["a", "b"], values=torch.arange(4), lengths=T([1, 2, 1]), stride_per_key_per_rank=[[1], [2]]
    )
    assert vbe.validate() is vbe


KT_CASES = [
    ((["a", "a"], [1, 1]), r"keys must be unique but \['a'\]"),
    ((["a"], [1, 1]), "length_per_key has 2 entries for 1 keys"),
    ((["a", "b"], [1, 2]), "length_per_key sums to 3 but values has 2 entries along key_dim 1"),
    ((["a", "b"], [-1, 3]), r"length_per_key must be non-negative, got \[-1, 3\]"),
]


@pytest.mark.parametrize(("args", "message"), KT_CASES)
def test_keyed_tensor_validate(args, message):
    kt = KeyedTensor(*args, values=torch.zeros(4, 2))
    with pytest.raises(ValueError, match=message):
        kt.validate()
    with pytest.raises(ValueError, match=r"key_dim 2 is out of range for values of shape \(4, 2\)"):
        KeyedTensor(["a"], [2], torch.zeros(4, 2), key_dim=2).validate()


def test_debug_checks_validate_every_construction():
    assert not checks_enabled()
    with debug_checks():
        assert checks_enabled()
        with pytest.raises(ValueError, match="lengths sum to 7 but values has 6 elements"):
            JaggedTensor(values=torch.arange(6), lengths=T([2, 3, 2]))
        with pytest.raises(ValueError, match=r"keys must be unique but \['a'\]"):
            KeyedJaggedTensor(keys=["a", "a"], values=torch.arange(2), lengths=T([1, 1]))
        with pytest.raises(ValueError, match="length_per_key sums to 3"):
            KeyedTensor(["a"], [3], torch.zeros(1, 2))
        with debug_checks(False):
            JaggedTensor(values=torch.arange(6), lengths=T([2, 3, 2]))  # switched off again inside
    JaggedTensor(values=torch.arange(6), lengths=T([2, 3, 2]))  # and off after the block


@pytest.mark.slow  # a fresh interpreter importing torch
def test_debug_checks_from_the_environment():
    code = (
        "import torch\n"
        "from rectrain.sparse import JaggedTensor\n"
        "try:\n"
        "    JaggedTensor(values=torch.arange(3), lengths=torch.tensor([5]))\n"
        "except ValueError as e:\n"
        "    print('rejected:', e)\n"
    )
    env_run = subprocess.run(
        [sys.executable, "-c", code],
        env={**__import__("os").environ, "RECTRAIN_SPARSE_CHECKS": "1"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    assert "rejected: Sum of lengths must equal the number of values" in env_run.stdout


def test_torchrec_validator_raises_warns_and_checks_ranges(caplog):
    bad = KeyedJaggedTensor(keys=["a", "b"], values=T([1, 2, 3, 4, 5]), lengths=T([3, 3, 2, 1]))
    with pytest.raises(ValueError, match="Sum of lengths must equal the number of values"):
        validate_keyed_jagged_tensor(bad)
    vbe = KeyedJaggedTensor(
        keys=["a", "b"],
        values=T([1, 2, 3, 4, 5]),
        lengths=T([1, 2, 0, 2]),
        stride_per_key_per_rank=[[1], [1]],
    )
    with caplog.at_level(logging.WARNING, logger="rectrain.sparse.jagged_tensor_validator"):
        assert validate_keyed_jagged_tensor(vbe)  # VBE problems only warn, as in TorchRec
    assert "Sum of stride_per_key_per_rank (2) must equal the number of lengths (4)" in caplog.text
    table = EmbeddingBagConfig(name="t", num_embeddings=4, embedding_dim=4, feature_names=["a"])
    ok = KeyedJaggedTensor(keys=["a"], values=T([0, 3]), lengths=T([2]))
    out_of_range = KeyedJaggedTensor(keys=["a"], values=T([0, 4]), lengths=T([2]))
    assert validate_keyed_jagged_tensor(ok, [table])
    assert not validate_keyed_jagged_tensor(out_of_range, [table])
