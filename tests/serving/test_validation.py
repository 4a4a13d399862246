"""``check_request``'s one-call path (TorchScript) accepts exactly what its op-by-op path accepts, and returns
the same tensors: drawn requests, valid or broken one field at a time, go through both."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recserve.errors import InvalidRequestError
from recserve.server import validation
from recserve.server.arrays import FeatureArrays
from recserve.server.validation import ModelSchema, check_request

from .conftest import DENSE, FEATURES, ROWS
from .strategies import SPEC_BREAKS, Spec, break_spec, valid_specs

SCHEMA = ModelSchema("m", "1", FEATURES, torch.tensor(ROWS), DENSE, frozenset(), 64)


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


def _outcome(arrays: FeatureArrays) -> tuple[str, tuple[torch.Tensor, ...]]:
    try:
        checked = check_request(arrays, SCHEMA)
    except InvalidRequestError as error:
        return str(error), ()
    kjt = checked.kjt
    return "ok", (checked.dense, kjt.lengths(), kjt.values(), torch.tensor(kjt.length_per_key()))


@settings(max_examples=150, deadline=None)
@given(data=st.data(), what=st.sampled_from([None, *SPEC_BREAKS]), int64_lengths=st.booleans())
def test_one_call_path_agrees_with_the_op_by_op_path(data, what, int64_lengths):
    spec = data.draw(valid_specs(min_batch=2))
    what, spec = break_spec(data.draw, spec, what, int64_lengths)
    arrays = _arrays(spec, torch.int64 if int64_lengths else torch.int32)
    fast = _outcome(arrays)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(validation, "_checked_tensors", lambda *args: None)  # every request takes the slow path
        slow = _outcome(arrays)
    assert fast[0] == slow[0]
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(fast[1], slow[1], strict=True))
    if what is None:
        assert fast[0] == "ok"


def test_one_call_path_runs_as_torchscript():
    args = (torch.zeros(2, DENSE), torch.ones(6, dtype=torch.int32), torch.zeros(6, dtype=torch.int64))
    dense, lengths, per_key = validation._checked_tensors(*args, SCHEMA.num_embeddings, 2, DENSE)
    assert lengths.dtype == torch.int64 and per_key.tolist() == [2, 2, 2]
    assert validation._checked_tensors(*args, SCHEMA.num_embeddings, 3, DENSE) is None  # 6 lengths != 3 x 3
    assert isinstance(validation._checked_tensors.compiled(), torch.jit.ScriptFunction)


@pytest.mark.parametrize("bad", ["nan_dense", "id_at_table_size", "lengths_sum_short"])
def test_one_call_path_refuses_what_the_checks_refuse(bad):
    dense, lengths, values = torch.zeros(2, DENSE), torch.ones(6, dtype=torch.int32), torch.zeros(6).long()
    if bad == "nan_dense":
        dense[1, 2] = float("nan")
    elif bad == "id_at_table_size":
        values[5] = ROWS[2]
    else:
        values = values[:5]
    assert validation._checked_tensors(dense, lengths, values, SCHEMA.num_embeddings, 2, DENSE) is None
