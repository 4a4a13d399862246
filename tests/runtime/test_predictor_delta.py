"""``Predictor.apply_delta``: base N plus deltas 1..k predicts bit for bit what a full export of the same
weights predicts (int8, fp16, mixed dtypes; one device or a row-split table; SUM and MEAN pooling), never
writes the shared base rows, and a refused delta leaves the predictor serving what it served."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from recserve.errors import PackageError
from recserve.runtime import Predictor, QuantEmbeddingBagCollection, overlay
from recserve.runtime.delta import fold_deltas, list_stream, manifest_sha256, read_delta
from recserve.runtime.layout import TableDType, row_bytes
from recserve.runtime.overlay import StitchedOverlay
from recserve.runtime.package import read_manifest, verify_files
from rectrain.sparse import KeyedJaggedTensor
from tests.export.common import request
from tests.runtime.delta_common import CFG, make_stream, split_capacity


@pytest.fixture(scope="module", autouse=True)
def fp32_unless_exported():
    """Both sides' dense parts in one precision on every CPU: on one with native bf16, an fp32 package's dense
    part runs in bf16 when its recorded accuracy passes the gate, and the follower keeps its base's choice
    while the full export of a later state may pass or fail it (a package exported as bf16 stays bf16)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RECSERVE_DENSE_DTYPE", "fp32")
        yield


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
    dense, kjt = request(CFG, 64, seed=3)
    base_logits = predictor.predict_logits(dense, kjt)
    stream.publish_delta(seed=11)
    stream.publish_delta(seed=12, tables=("t0", "t3"))
    follow(predictor, stream.publish)
    assert predictor.model_version == "1.2" and predictor.model_step == 200
    assert predictor.wall_time == 1e9 + 2
    full = Predictor.load(stream.full_export(tmp_path / "full"))
    assert_same_predictions(predictor, full)
    assert not torch.equal(base_logits, full.predict_logits(dense, kjt))  # the deltas mattered


def _mean_cfg():
    """CFG with t3 (split over cpu:0 and cpu:1, shares feature f0 with t0) pooled MEAN: its kernels pool SUM
    and the collection divides by the whole bag's length."""
    tables = [dataclasses.replace(t, pooling="MEAN") if t.name == "t3" else t for t in CFG.tables]
    return dataclasses.replace(CFG, tables=tables)


@pytest.mark.parametrize(
    "cfg, options",
    [
        (CFG, {"dtype": "int8", "table_dtypes": {"t0": "fp16", "t3": "int4", "t1": "int2"}}),
        (_mean_cfg(), {"dtype": "int8", **PLACEMENTS["row-split"]("int8")}),
        (CFG, {"dtype": "int4", "dense_dtype": "bf16"}),
    ],
    ids=["mixed widths in one kernel", "MEAN table split over devices", "int4 tables, bf16 dense part"],
)
def test_more_layouts_predict_like_a_full_export(tmp_path, cfg, options):
    stream = make_stream(tmp_path / "publish", cfg, **options)
    predictor = Predictor.load(stream.base)
    for seed in (21, 22, 23):
        stream.publish_delta(seed)
    follow(predictor, stream.publish)
    assert predictor.model_version == "1.3"
    assert_same_predictions(predictor, Predictor.load(stream.full_export(tmp_path / "full")), cfg)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """A predictor on base 1 with delta 1 applied, delta 2 published, and a full export of state 2."""
    tmp = tmp_path_factory.mktemp("served")
    stream = make_stream(tmp / "publish", **PLACEMENTS["row-split"]("int8"))
    stream.publish_delta(seed=31)
    predictor = follow(Predictor.load(stream.base), stream.publish)
    stream.publish_delta(seed=32)
    return stream, predictor, stream.full_export(tmp / "full")


def _next(stream):
    base, deltas = list_stream(stream.publish)
    return read_delta(deltas[1], read_manifest(base), manifest_sha256(base), 2)


def _wrong_width(delta):
    ids, rows = delta.rows["t0"]
    return dataclasses.replace(delta, rows={**delta.rows, "t0": (ids, rows[:, :8])})


def _out_of_range(delta):
    ids, rows = delta.rows["t3"]
    return dataclasses.replace(delta, rows={**delta.rows, "t3": (ids + 80, rows)})


def _dense_shape(delta):
    key = next(k for k, v in delta.dense.items() if v.dim() and v.shape[0] > 1)
    return dataclasses.replace(delta, dense={**delta.dense, key: delta.dense[key][:1]})


REFUSED = {
    "skipped sequence": (lambda d: dataclasses.replace(d, sequence=3), r"sequence 3, expected 2"),
    "foreign base": (
        lambda d: dataclasses.replace(d, base_manifest_sha256="0" * 64),
        r"base_manifest_sha256 '0{64}' is not the served base's",
    ),
    "other base version": (lambda d: dataclasses.replace(d, base_version="7"), r"base_version '7'"),
    "wrong row width": (_wrong_width, r"rows must be uint8 \[n, 12\], got torch.uint8 \(\d+, 8\)"),
    "id out of range": (_out_of_range, r"rows.safetensors: t3.ids: outside the table's rows \[0, 80\)"),
    "dense shape": (_dense_shape, r"dense.safetensors: .*: shape \[1"),
}


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_refused_delta_leaves_the_predictor_serving_what_it_served(served, case):
    stream, predictor, _ = served
    spoil, message = REFUSED[case]
    dense, kjt = request(CFG, 40, seed=8)
    before, overlay = predictor.predict_logits(dense, kjt), predictor.overlay_bytes
    with pytest.raises(PackageError, match=message):
        predictor.apply_delta(spoil(_next(stream)))
    assert predictor.model_version == "1.1" and predictor.model_step == 100
    assert predictor.overlay_bytes == overlay
    assert torch.equal(predictor.predict_logits(dense, kjt), before)


def test_the_next_good_delta_applies_after_refusals(served):
    stream, predictor, full = served
    bad = dataclasses.replace(_next(stream), sequence=3)
    with pytest.raises(PackageError):
        predictor.apply_delta(bad)
    predictor.apply_delta(_next(stream))
    assert predictor.model_version == "1.2"
    assert_same_predictions(predictor, Predictor.load(full))
    with pytest.raises(PackageError, match="sequence 2, expected 3"):
        predictor.apply_delta(_next(stream))  # the same delta twice


def test_base_rows_stay_shared_and_unwritten_and_a_delta_adds_at_most_its_size(tmp_path):
    stream = make_stream(tmp_path / "publish")
    predictor = Predictor.load(stream.base)
    lookups = next(m for m in predictor.model.modules() if isinstance(m, QuantEmbeddingBagCollection))
    kernels = [lookup.tbe for lookup in lookups._lookups]
    mapped = [(k.weights_host.data_ptr(), k.weights_host.clone()) for k in kernels]
    for seed in (41, 42):
        path = stream.publish_delta(seed)
        base, deltas = list_stream(stream.publish)
        delta = read_delta(path, read_manifest(base), manifest_sha256(base), len(deltas))
        size = sum(f.stat().st_size for f in path.iterdir())
        before = predictor.overlay_bytes
        predictor.apply_delta(delta)
        assert 0 < predictor.overlay_bytes - before <= size  # rows and their index, nothing of the base
    request_batch = request(CFG, 64, seed=4)
    predictor.predict_logits(*request_batch)
    for kernel, (pointer, content) in zip(kernels, mapped):
        assert kernel.weights_host.data_ptr() == pointer  # still the package's mapping, not a copy
        assert torch.equal(kernel.weights_host, content)
    verify_files(stream.base, read_manifest(stream.base))  # the files are as exported


def test_empty_batches_and_empty_bags_after_deltas(served):
    stream, predictor, full = served
    want, predictor = Predictor.load(full), follow(predictor, stream.publish)
    keys = ["f0", "f1", "g1", "f2", "f3"]
    for batch in (2, 0):  # every bag empty; no example at all
        kjt = KeyedJaggedTensor.from_lengths_sync(
            keys=keys,
            values=torch.tensor([], dtype=torch.int64),
            lengths=torch.zeros(5 * batch, dtype=torch.int64),
        )
        dense = torch.randn(batch, CFG.dense_in_features)
        assert torch.equal(predictor.predict_logits(dense, kjt), want.predict_logits(dense, kjt))


def test_a_delta_of_the_dense_part_alone(tmp_path):
    stream = make_stream(tmp_path / "publish")
    stream.publish_delta(seed=51, tables=())
    predictor = follow(Predictor.load(stream.base), stream.publish)
    assert predictor.model_version == "1.1" and predictor.overlay_bytes == 0
    assert_same_predictions(predictor, Predictor.load(stream.full_export(tmp_path / "full")))


def test_rows_changed_in_place_through_log_compaction_predict_like_a_full_export(tmp_path, monkeypatch):
    """Package-mapped kernels read changed rows in place (a stitched range); deltas that fill a table's
    log move the live rows into a new range, and every version still predicts like a full export."""
    monkeypatch.setattr(overlay, "_LOG_ROWS_PER_ROW", 1)  # logs fill within a few deltas of these tables
    stream = make_stream(tmp_path / "publish")
    predictor = Predictor.load(stream.base)
    lookups = next(m for m in predictor.model.modules() if isinstance(m, QuantEmbeddingBagCollection))
    ranges = set()
    for seed in range(30, 38):
        stream.publish_delta(seed)
        follow(predictor, stream.publish)
        overlays = [lookup.overlay for lookup in lookups._lookups]
        assert all(isinstance(o, StitchedOverlay) for o in overlays)
        ranges.add(tuple(id(o.log) for o in overlays))
    assert len(ranges) > 1  # a log was compacted into a new range
    assert predictor.model_version == "1.8"
    assert_same_predictions(predictor, Predictor.load(stream.full_export(tmp_path / "full")))


def test_folded_deltas_apply_as_one_and_serve_what_applying_each_serves(tmp_path):
    stream = make_stream(tmp_path / "publish")
    for seed, tables in ((51, None), (52, ("t0", "t3")), (53, ("t1",))):
        stream.publish_delta(seed, tables)
    base, paths = list_stream(stream.publish)
    manifest, sha = read_manifest(base), manifest_sha256(base)
    deltas = [read_delta(path, manifest, sha, seq) for seq, path in enumerate(paths, start=1)]
    with pytest.raises(PackageError, match="cannot fold delta 3 of base 1 onto delta 1"):
        fold_deltas([deltas[0], deltas[2]])
    folded = fold_deltas([fold_deltas(deltas[:2]), deltas[2]])  # a fold folds on
    assert (folded.starts_at, folded.sequence, folded.step) == (1, 3, deltas[2].step)
    one, each = Predictor.load(base), follow(Predictor.load(base), stream.publish)
    one.apply_delta(folded)
    assert one.model_version == each.model_version == "1.3"
    assert_same_predictions(one, each)
    with pytest.raises(PackageError, match="sequence 1, expected 4"):
        one.apply_delta(folded)  # the same fold twice
