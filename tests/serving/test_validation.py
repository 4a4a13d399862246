"""A request queued past the wire rules (``admit_request``) and checked with its batch by the predictor gets
what it gets checked alone (``check_request``): the same scores, or the same error naming its field, and the
request beside it in the batch its own scores. Drawn requests, valid or broken one field at a time."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from recserve.errors import InvalidRequestError
from recserve.runtime import Predictor
from recserve.server.dataplane.arrays import FeatureArrays
from recserve.server.dataplane.batcher import BatcherConfig
from recserve.server.dataplane.runner import ModelRunner
from recserve.server.dataplane.validation import admit_request, check_request

from .conftest import random_batch
from .strategies import SPEC_BREAKS, Spec, break_spec, valid_specs


@pytest.fixture(scope="module")
def runner(packages):
    r = ModelRunner(Predictor.load(packages["1"]), BatcherConfig(max_batch_size=64))
    yield r
    r.close()


def _arrays(spec: Spec, lengths_dtype: torch.dtype) -> FeatureArrays:
    weights = None if spec.weights is None else torch.from_numpy(np.concatenate(spec.weights))
    return FeatureArrays(
        batch_size=spec.batch,
        dense=torch.from_numpy(spec.dense.reshape(-1).copy()),
        keys=list(spec.keys),
        lengths=torch.from_numpy(spec.flat_lengths()).to(lengths_dtype),
        values=torch.from_numpy(np.concatenate(spec.values) if spec.values else np.zeros(0, np.int64)),
        weights=weights,
    )


def _good() -> FeatureArrays:
    dense, kjt = random_batch(3, seed=7)
    return FeatureArrays(3, dense.reshape(-1), kjt.keys(), kjt.lengths(), kjt.values())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), what=st.sampled_from([None, *SPEC_BREAKS]), int64_lengths=st.booleans())
def test_checked_with_its_batch_is_checked_as_alone(runner, data, what, int64_lengths):
    spec = data.draw(valid_specs(min_batch=2))
    what, spec = break_spec(data.draw, spec, what, int64_lengths)
    arrays = _arrays(spec, torch.int64 if int64_lengths else torch.int32)
    try:
        alone = runner._predict_batch([check_request(arrays, runner.schema)], record=False)[0]
    except InvalidRequestError as error:
        alone = error
    good = _good()
    good_alone = runner._predict_batch([check_request(good, runner.schema)], record=False)[0]
    try:
        items = [admit_request(arrays, runner.schema), admit_request(good, runner.schema)]
    except InvalidRequestError as error:  # a wire rule: refused on arrival, as alone
        assert isinstance(alone, InvalidRequestError) and str(error) == str(alone)
        return
    got, beside = runner._predict_batch(items, record=False)
    if isinstance(alone, Exception):
        assert type(got) is type(alone) and str(got) == str(alone)
    else:
        torch.testing.assert_close(got, alone, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(beside, good_alone, rtol=1e-5, atol=1e-6)
    if what is None:
        assert not isinstance(alone, Exception)


def test_keys_in_another_order_are_scored_as_in_the_model_order(runner):
    dense, kjt = random_batch(3, seed=11)
    keys = list(reversed(kjt.keys()))
    reordered = kjt.permute([kjt.keys().index(k) for k in keys])
    arrays = FeatureArrays(3, dense.reshape(-1), keys, reordered.lengths(), reordered.values())
    in_order = FeatureArrays(3, dense.reshape(-1), kjt.keys(), kjt.lengths(), kjt.values())
    expected = runner._predict_batch([check_request(in_order, runner.schema)], record=False)[0]
    for item in (admit_request(arrays, runner.schema), check_request(arrays, runner.schema)):
        assert item.kjt.keys() == runner.schema.feature_names
        (got,) = runner._predict_batch([item], record=False)
        torch.testing.assert_close(got, expected)
