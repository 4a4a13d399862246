"""Predictor.predict never hands FBGEMM out-of-bounds data, whatever ``checked`` says.

Each example builds a valid ``(dense, KJT)``, breaks one field (extreme int64, sums that wrap modulo 2^64,
negatives, NaN, wrong shapes and dtypes) and expects an ``InvalidRequestError`` naming that field; the next
valid batch must still score. KJTs are built with ``validate=False`` so that only the predictor checks them.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from recserve.errors import InvalidRequestError, RecServeError
from recserve.export import export_package, synthetic_sample
from recserve.runtime import Predictor
from rectrain.embedding import EmbeddingBagConfig
from rectrain.models.config import ModelConfig
from rectrain.sparse import KeyedJaggedTensor
from tests.export.common import dlrm_config, trained_state

CFG = dlrm_config()
KEYS = ["f0", "f1", "g1", "f2", "f3"]
ROWS = {"f0": 80, "f1": 200, "g1": 200, "f2": 120, "f3": 80}
BIG = [2**62, 2**63 - 1, 2**32, 2**31]


@pytest.fixture(scope="module")
def predictor(tmp_path_factory):
    path = export_package(
        tmp_path_factory.mktemp("pkg") / "p",
        model_config=CFG,
        state_dict=trained_state(CFG),
        devices=["cpu:0", "cpu:1"],
        accuracy_sample=synthetic_sample(CFG, 64),
    )
    return Predictor.load(path)


def _wrap(x: int) -> int:
    """``x`` as an int64 wraps it."""
    return (x + 2**63) % 2**64 - 2**63


@st.composite
def valid_batches(draw):
    batch = draw(st.integers(1, 4))
    lengths = draw(st.lists(st.integers(0, 3), min_size=5 * batch, max_size=5 * batch))
    values = []
    for index, length in enumerate(lengths):
        rows = ROWS[KEYS[index // batch]]
        values += draw(st.lists(st.integers(0, rows - 1), min_size=length, max_size=length))
    weighted = draw(st.booleans())
    return {
        "batch": batch,
        "dense": torch.randn(batch, 5),
        "lengths": torch.tensor(lengths, dtype=torch.int64),
        "offsets": None,
        "values": torch.tensor(values, dtype=torch.int64),
        "weights": torch.rand(len(values)) if weighted else None,
    }


def _break_lengths(draw, b):
    lengths = b["lengths"].tolist()
    how = draw(st.sampled_from(["extreme", "negative", "wrap_same", "wrap_negative", "dtype", "shape"]))
    i = draw(st.integers(0, len(lengths) - 1))
    if how == "extreme":
        lengths[i] = draw(st.sampled_from(BIG))
    elif how == "negative":
        lengths[i] = draw(st.sampled_from([-1, -(2**63), -(2**62)]))
    elif how == "wrap_same":  # four entries + 2^62 each: the int64 sum is unchanged
        for j in range(4):  # a batch has at least 5 bags
            lengths[j] = _wrap(lengths[j] + 2**62)
    elif how == "wrap_negative":  # + 2^63 twice: the sum is unchanged, the entries negative
        j = (i + 1) % len(lengths) if len(lengths) > 1 else i
        lengths[i] = _wrap(lengths[i] + 2**63)
        lengths[j] = _wrap(lengths[j] + 2**63) if j != i else lengths[j]
    elif how == "dtype":
        b["lengths"] = torch.tensor(lengths, dtype=torch.float32).index_fill(
            0, torch.tensor([i]), float("nan")
        )
        return
    else:
        lengths = lengths + [0]
    b["lengths"] = torch.tensor(lengths, dtype=torch.int64)


def _break_offsets(draw, b):
    offsets = torch.cat([torch.zeros(1, dtype=torch.int64), b["lengths"].cumsum(0)]).tolist()
    b["lengths"] = None
    how = draw(st.sampled_from(["extreme", "negative", "decreasing", "last", "first"]))
    i = draw(st.integers(0, len(offsets) - 1))
    if how == "extreme":
        offsets[i] = draw(st.sampled_from(BIG))
    elif how == "negative":
        offsets[i] = -(2**63)
    elif how == "decreasing":  # diff() of these int64s wraps to a positive step if unchecked
        offsets = [0, 2**63 - 1, *[-(2**63)] * (len(offsets) - 3), len(b["values"])]
    elif how == "last":
        offsets[-1] += 1
    else:
        offsets[0] = 1
    b["offsets"] = torch.tensor(offsets, dtype=torch.int64)


def _break_values(draw, b):
    if b["values"].numel() == 0 or draw(st.booleans()):
        b["values"] = torch.tensor([float("nan")] * max(1, b["values"].numel()))
        b["lengths"] = None
        b["offsets"] = torch.tensor([0] * (5 * b["batch"]) + [b["values"].numel()])
        b["weights"] = None
        return
    i = draw(st.integers(0, b["values"].numel() - 1))
    b["values"] = b["values"].clone()
    b["values"][i] = draw(st.sampled_from([-1, 2**63 - 1, -(2**63), 10**9, 200]))


def _break_weights(draw, b):
    n = b["values"].numel()
    b["weights"] = draw(
        st.sampled_from(
            [torch.rand(n + 1), torch.ones(n, 2), torch.ones(n, dtype=torch.int64), torch.rand(max(n - 1, 0))]
        )
    )
    if b["weights"].dim() == 1 and b["weights"].is_floating_point() and b["weights"].numel() == n:
        b["weights"] = torch.rand(n + 3)


def _break_dense(draw, b, checked):
    how = draw(
        st.sampled_from(["nan", "width", "rows", "dtype", "rank"] if not checked else ["width", "rows"])
    )
    batch = b["batch"]
    b["dense"] = {
        "nan": torch.full((batch, 5), float("nan")),
        "width": torch.randn(batch, 4),
        "rows": torch.randn(batch + 1, 5),
        "dtype": torch.ones(batch, 5, dtype=torch.int64),
        "rank": torch.randn(batch * 5),
    }[how]


FIELDS = {
    "lengths": (_break_lengths, r"sparse (lengths|offsets)"),
    "offsets": (_break_offsets, r"sparse offsets"),
    "values": (_break_values, r"sparse (values|offsets)|feature '\w+' has id"),
    "weights": (_break_weights, r"sparse weights"),
}


def _kjt(b) -> KeyedJaggedTensor:
    return KeyedJaggedTensor(
        keys=KEYS,
        values=b["values"],
        weights=b["weights"],
        lengths=b["lengths"],
        offsets=b["offsets"],
        stride=b["batch"],
        validate=False,
    )


@given(
    batch=valid_batches(), field=st.sampled_from([*FIELDS, "dense"]), checked=st.booleans(), data=st.data()
)
def test_one_broken_field_is_named_and_the_next_batch_scores(predictor, batch, field, checked, data):
    valid = dict(batch)
    if field == "dense":
        _break_dense(data.draw, batch, checked)
        pattern = r"dense"
    else:
        breaker, pattern = FIELDS[field]
        breaker(data.draw, batch)
    with pytest.raises(InvalidRequestError, match=pattern):
        predictor.predict(batch["dense"], _kjt(batch), checked=checked)
    scores = predictor.predict(valid["dense"], _kjt(valid), checked=checked)
    assert scores.shape == (valid["batch"],) and bool(torch.isfinite(scores).all())


def test_forged_caches_do_not_reach_the_kernels(predictor):
    """A KJT whose cached length_per_key or lengths lie about its offsets is refused or ignored."""
    values = torch.tensor([1, 2, 3, 4, 5])
    honest = KeyedJaggedTensor(keys=KEYS, values=values, lengths=torch.ones(5, dtype=torch.int64), stride=1)
    dense = torch.randn(1, 5)
    lying = KeyedJaggedTensor(
        keys=KEYS,
        values=values,
        lengths=torch.ones(5, dtype=torch.int64),
        stride=1,
        length_per_key=[10**6, 0, 0, 0, -(10**6) + 5],
        validate=False,
    )
    assert torch.equal(predictor.predict(dense, lying, checked=True), predictor.predict(dense, honest))
    disagree = KeyedJaggedTensor(
        keys=KEYS,
        values=values,
        lengths=torch.tensor([5, 0, 0, 0, 0]),
        offsets=torch.arange(6),
        stride=1,
        validate=False,
    )
    with pytest.raises(InvalidRequestError, match="lengths and offsets disagree"):
        predictor.predict(dense, disagree, checked=True)


# ---------------------------------------------------------------------------------------- the issue's request

ISSUE_FEATURES = [f"cat_{i}" for i in range(26)]


@pytest.fixture(scope="module")
def criteo_like(tmp_path_factory):
    tables = [
        EmbeddingBagConfig(name=f"t_{f}", num_embeddings=16, embedding_dim=8, feature_names=[f])
        for f in ISSUE_FEATURES
    ]
    cfg = ModelConfig(
        kind="dlrm", tables=tables, dense_in_features=13,
        dense_arch_layer_sizes=[8, 8], over_arch_layer_sizes=[8, 1],
    )  # fmt: skip
    path = export_package(
        tmp_path_factory.mktemp("pkg") / "criteo",
        model_config=cfg,
        state_dict=trained_state(cfg),
        accuracy_sample=synthetic_sample(cfg, 32),
        force=True,
    )
    return Predictor.load(path)


@pytest.mark.parametrize(
    ("lengths", "num_values"),
    [
        ([2**62, 2**62, 2**62, 2**62 + 3] + [1] * 22, 25),  # sums to 25 modulo 2^64
        ([2**62, 2**62, 2**62, 2**62 - 22] + [1] * 22, 0),  # sums to 0 modulo 2^64
    ],
    ids=["wrap-to-25", "wrap-to-0"],
)
@pytest.mark.parametrize("checked", [False, True])
@pytest.mark.parametrize("as_offsets", [False, True])
def test_issue_17_request_is_refused(criteo_like, lengths, num_values, checked, as_offsets):
    lengths = torch.tensor(lengths, dtype=torch.int64)
    assert int(lengths.sum()) == num_values  # the int64 sum wraps: a sum check alone lets it through
    jagged = {"lengths": lengths}
    if as_offsets:  # the same request as offsets: the cumulative sum wraps back to [0, ..., 25]
        jagged = {"offsets": torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])}
    kjt = KeyedJaggedTensor(
        keys=ISSUE_FEATURES,
        values=torch.ones(num_values, dtype=torch.int64),
        stride=1,
        validate=False,
        **jagged,
    )
    outside = (
        r"sparse (lengths: (negative )?length -?\d+ \(feature '\w+', example \d+\)"
        r"|offsets: offset -?\d+ at position \d+ is outside \[0, \d+\])"
    )
    with pytest.raises(RecServeError, match=outside):
        criteo_like.predict(torch.zeros(1, 13), kjt, checked=checked)
    valid = KeyedJaggedTensor(
        keys=ISSUE_FEATURES,
        values=torch.ones(26, dtype=torch.int64),
        lengths=torch.ones(26, dtype=torch.int64),
    )
    assert criteo_like.predict(torch.zeros(1, 13), valid, checked=checked).shape == (1,)


@pytest.mark.parametrize(
    ("field", "message"),
    [
        ({"lengths": [1, 1, 1, 1, 1]}, r"sparse lengths must be a 1-D int32 or int64 tensor, got list"),
        ({"lengths": torch.ones(5, 1, dtype=torch.int64)}, r"sparse lengths must be a 1-D .* shape \(5, 1\)"),
        (
            {"offsets": torch.arange(6.0)},
            r"sparse offsets must be a 1-D int32 or int64 tensor, got torch\.float32",
        ),
        ({"values": torch.ones(5, 1, dtype=torch.int64)}, r"sparse values must be a 1-D tensor"),
        ({"weights": [1.0] * 5}, r"sparse weights must be a 1-D float tensor, got list"),
    ],
    ids=["lengths list", "lengths 2-D", "float offsets", "values 2-D", "weights list"],
)
def test_fields_of_the_wrong_type_are_named(predictor, field, message):
    parts = {"values": torch.arange(5), "lengths": torch.ones(5, dtype=torch.int64), **field}
    if "offsets" in field:
        parts.pop("lengths")
    kjt = KeyedJaggedTensor(keys=KEYS, stride=1, validate=False, **parts)
    for checked in (False, True):
        with pytest.raises(InvalidRequestError, match=message):
            predictor.predict(torch.zeros(1, 5), kjt, checked=checked)
