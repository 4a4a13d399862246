"""The dense range a run records, and the bound export and serving derive from it (issue 33)."""

from __future__ import annotations

import json
import math

import grpc
import numpy as np
import pytest
import torch

from recserve.cli import main as recserve_main
from recserve.errors import InvalidRequestError, PackageError
from recserve.runtime import Predictor
from recserve.runtime.dense_bounds import DenseBounds, bounds_from_range
from recserve.server.transports.protos import pb2, pb2_grpc
from rectrain.cli import main as rectrain_main
from rectrain.train.dense_range import DenseRange
from tests.distributed.multiprocess import run_multiprocess
from tests.serving.conftest import running_server, target
from tests.test_cli import SYNTHETIC, small_run


def test_the_range_covers_every_batch_ignores_non_finite_values_and_restores():
    tracked = DenseRange()
    tracked.update(torch.tensor([[1.0, -2.0], [3.0, float("nan")]]))
    tracked.update(torch.tensor([[0.5, 7.0]]))
    assert tracked.gathered(None) == {"min": [0.5, -2.0], "max": [3.0, 7.0]}
    resumed = DenseRange()
    resumed.restore(tracked.gathered(None))
    resumed.update(torch.tensor([[9.0, 0.0]]))
    assert resumed.gathered(None) == {"min": [0.5, -2.0], "max": [9.0, 7.0]}
    assert DenseRange().gathered(None) is None
    DenseRange().restore({"min": "x"})  # a malformed record adds nothing


def _ranks_range(env) -> dict:
    tracked = DenseRange()
    tracked.update(torch.tensor([[float(env.rank), -float(env.rank)]]))
    return tracked.gathered(env)


def test_the_range_is_gathered_over_every_rank():
    assert run_multiprocess(_ranks_range, 2) == [{"min": [0.0, -1.0], "max": [1.0, 0.0]}] * 2


def test_bounds_widen_the_range_and_refuse_or_clip_beyond_it():
    # Widened by 10x the column's scale: its span (10), its largest magnitude (5), or 1 (a column in [0, 0]).
    bounds = bounds_from_range({"min": [0.0, 5.0, 0.0, None], "max": [10.0, 5.0, 0.0, None]}, "refuse")
    assert bounds["min"] == [-100.0, -45.0, -10.0, None] and bounds["max"] == [110.0, 55.0, 10.0, None]
    refuse = DenseBounds.parse(bounds, 4, "m.json")
    inside = torch.tensor([[109.0, -44.5, 9.0, 1e30]])
    assert torch.equal(refuse.apply(inside), inside)
    with pytest.raises(InvalidRequestError, match=r"dense\[1\]\[1\]: 70 is outside \[-45, 55\]"):
        refuse.apply(torch.tensor([[0.0, 5.0, 0.0, 0.0], [0.0, 70.0, 0.0, 0.0]]))
    clip = DenseBounds.parse({**bounds, "action": "clip"}, 4, "m.json")
    assert clip.apply(torch.tensor([[-500.0, 70.0, 3.0, -1e9]])).tolist() == [[-100.0, 55.0, 3.0, -1e9]]
    for broken, field in (
        ({**bounds, "action": "wrap"}, "'action'"),
        ({**bounds, "min": [0.0]}, "dense_bounds.min"),
        ({**bounds, "max": [1.0, "x", 1.0, None]}, "dense_bounds.max"),
        ({**bounds, "min": [300.0, 4.0, 0.0, None]}, "min is above its max"),
    ):
        with pytest.raises(PackageError, match=field):
            DenseBounds.parse(broken, 4, "m.json")


@pytest.mark.slow
def test_a_trained_run_exports_its_bound_and_the_server_refuses_beyond_it(tmp_path, capsys):
    run = ["--config", SYNTHETIC, *small_run(tmp_path)]
    assert rectrain_main(["train", *run, "--no-progress"]) == 0
    extra = json.loads((tmp_path / "ckpt" / "step_12" / "manifest.json").read_text())["extra"]
    recorded = extra["dense_range"]
    assert len(recorded["min"]) == len(recorded["max"]) > 0
    assert all(lo <= hi for lo, hi in zip(recorded["min"], recorded["max"]) if lo is not None)
    out = tmp_path / "pkg"
    assert recserve_main(["export", "--checkpoint", str(tmp_path / "ckpt"), "--out", str(out)]) == 0
    bounds = json.loads((out / "manifest.json").read_text())["dense_bounds"]
    assert bounds["action"] == "refuse" and "step 12" in bounds["source"]
    metadata = Predictor.load(out).metadata
    width = metadata.dense_in_features
    assert metadata.dense_bounds is not None and metadata.dense_bounds.low.numel() == width
    flt_max = float(np.finfo(np.float32).max)
    dense = torch.zeros(2, width)
    dense[1, 0] = flt_max
    keys = metadata.feature_names
    request = pb2.PredictRequest(batch_size=2)
    request.dense.data.extend(dense.reshape(-1).tolist())
    request.sparse.keys.extend(keys)
    request.sparse.lengths.extend([1] * 2 * len(keys))
    request.sparse.values.extend([0] * 2 * len(keys))
    with running_server(out) as server, grpc.insecure_channel(target(server)) as channel:
        with pytest.raises(grpc.RpcError) as info:
            pb2_grpc.PredictorStub(channel).Predict(request)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details().startswith(f"dense[1][0]: {flt_max:g} is outside [")
        request.dense.data[width] = 0.0
        assert all(math.isfinite(s) for s in pb2_grpc.PredictorStub(channel).Predict(request).scores)
