"""Predictor requests: malformed batches are named, concurrent calls agree with serial ones."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from recserve.errors import InvalidRequestError
from recserve.export import export_package, synthetic_sample
from recserve.runtime import Predictor
from rectrain.sparse import KeyedJaggedTensor
from tests.export.common import dlrm_config, request, trained_state

CFG = dlrm_config()


@pytest.fixture(scope="module")
def predictor(tmp_path_factory):
    path = export_package(
        tmp_path_factory.mktemp("pkg") / "p",
        model_config=CFG,
        state_dict=trained_state(CFG),
        devices=["cpu:0", "cpu:1"],
        accuracy_sample=synthetic_sample(CFG, 256),
    )
    return Predictor.load(path)


def _kjt(keys, lengths, values):
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys, values=torch.tensor(values), lengths=torch.tensor(lengths)
    )


def test_requests_are_checked(predictor):
    dense, kjt = request(CFG, batch=4)
    with pytest.raises(InvalidRequestError, match=r"dense has 3 features per example; the model takes 5"):
        predictor.predict(dense[:, :3], kjt)
    with pytest.raises(InvalidRequestError, match=r"dense has 3 examples but the sparse features have 4"):
        predictor.predict(dense[:3], kjt)
    with pytest.raises(InvalidRequestError, match=r"2-D tensor"):
        predictor.predict(dense[0], kjt)
    partial = _kjt(["f0"], [1, 1, 1, 1], [0, 1, 2, 3])
    with pytest.raises(InvalidRequestError, match=r"sparse keys: missing feature 'f1', 'g1', 'f2', 'f3' "):
        predictor.predict(dense, partial)


def test_a_checked_batch_scores_the_same_without_the_checks(predictor):
    dense, kjt = request(CFG, batch=16)
    torch.testing.assert_close(predictor.predict(dense, kjt, checked=True), predictor.predict(dense, kjt))


@pytest.mark.parametrize(
    ("feature", "bad_id", "limit"), [("f0", 80, 80), ("f2", -1, 120), ("g1", 10**9, 200)]
)
def test_out_of_range_id_names_feature(predictor, feature, bad_id, limit):
    keys = ["f0", "f1", "g1", "f2", "f3"]
    values = [1 if k != feature else bad_id for k in keys]
    kjt = _kjt(keys, [1] * len(keys), values)
    message = rf"feature '{feature}' has id {bad_id} outside its table's range \[0, {limit}\)"
    with pytest.raises(InvalidRequestError, match=message):
        predictor.predict(torch.zeros(1, 5), kjt)


def test_empty_batch_and_empty_bags(predictor):
    keys = ["f0", "f1", "g1", "f2", "f3"]
    assert predictor.predict(torch.zeros(0, 5), _kjt(keys, [], [])).shape == (0,)
    scores = predictor.predict(torch.zeros(2, 5), _kjt(keys, [0] * 10, []))
    assert scores.shape == (2,) and bool(torch.isfinite(scores).all())


def test_concurrent_predicts_match_serial(predictor):
    batches = [request(CFG, batch=8 + i, seed=i) for i in range(12)]
    serial = [predictor.predict(dense, kjt) for dense, kjt in batches]
    with ThreadPoolExecutor(max_workers=4) as pool:
        parallel = list(pool.map(lambda b: predictor.predict(*b), batches * 3))
    for index, scores in enumerate(parallel):
        assert torch.equal(scores, serial[index % len(batches)])
