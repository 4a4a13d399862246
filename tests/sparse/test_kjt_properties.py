"""Property tests of KeyedJaggedTensor against a pure-Python model, fixed and variable batch size per key."""

import torch
from hypothesis import given
from hypothesis import strategies as st

from rectrain.sparse import KeyedJaggedTensor, jt_is_equal, kjt_is_equal
from tests.sparse.strategies import assert_weights_follow_values, build_kjt, kjt_models, model_of


@given(data=kjt_models())
def test_build_and_read_back(data):
    model, weighted, variable = data
    kjt = build_kjt(model, weighted, variable)
    assert model_of(kjt) == model
    assert kjt.length_per_key() == [sum(len(r) for r in rows) for rows in model.values()]
    assert kjt.stride_per_key() == [len(rows) for rows in model.values()]
    assert kjt.variable_stride_per_key() == variable


@given(data=kjt_models(), st_data=st.data())
def test_permute_then_inverse_permute_is_identity(data, st_data):
    model, weighted, variable = data
    kjt = build_kjt(model, weighted, variable)
    order = st_data.draw(st.permutations(range(len(model))))
    permuted = kjt.permute(list(order))
    keys = list(model)
    assert model_of(permuted) == {keys[i]: model[keys[i]] for i in order}
    assert_weights_follow_values(permuted)
    inverse = sorted(range(len(order)), key=lambda i: order[i])
    assert kjt_is_equal(permuted.permute(inverse), kjt)


@given(data=kjt_models(), st_data=st.data())
def test_permute_to_a_subset_of_keys(data, st_data):
    model, weighted, variable = data
    kjt = build_kjt(model, weighted, variable).unsync()
    subset = st_data.draw(st.lists(st.sampled_from(range(len(model))), unique=True) if model else st.just([]))
    keys = list(model)
    picked = kjt.permute(subset)
    assert model_of(picked) == {keys[i]: model[keys[i]] for i in subset}
    assert_weights_follow_values(picked)


@given(data=kjt_models(), st_data=st.data())
def test_split_then_concat_is_identity(data, st_data):
    model, weighted, variable = data
    kjt = build_kjt(model, weighted, variable)
    segments, left = [], len(model)
    while left:
        segments.append(st_data.draw(st.integers(0, left)))
        left -= segments[-1]
    segments.append(0)
    parts = kjt.split(segments)
    assert [p.keys() for p in parts] == [
        list(model)[sum(segments[:i]) : sum(segments[: i + 1])] for i in range(len(segments))
    ]
    for part in parts:
        assert model_of(part) == {k: rows for k, rows in model.items() if k in part.index_per_key()}
        assert_weights_follow_values(part)
    assert kjt_is_equal(KeyedJaggedTensor.concat(parts), kjt)


@given(data=kjt_models())
def test_to_dict_from_jt_dict_round_trip(data):
    model, weighted, variable = data
    kjt = build_kjt(model, weighted, variable)
    jts = kjt.to_dict()
    assert {k: [t.tolist() for t in jt.to_dense()] for k, jt in jts.items()} == model
    for key, jt in jts.items():
        # A key without rows gets empty offsets from to_dict (TorchRec's behaviour), [0] from kjt[key].
        assert jt_is_equal(jt, kjt[key]) or (jt.lengths().numel() == 0 and kjt[key].lengths().numel() == 0)
    rebuilt = KeyedJaggedTensor.from_jt_dict(jts)
    assert model_of(rebuilt) == model
    if model:
        assert kjt_is_equal(rebuilt, kjt)


@given(data=kjt_models())
def test_offsets_construction_matches_lengths_construction(data):
    model, weighted, variable = data
    kjt = build_kjt(model, weighted, variable)
    from_offsets = KeyedJaggedTensor.from_offsets_sync(
        kjt.keys(),
        kjt.values(),
        kjt.offsets(),
        weights=kjt.weights_or_none(),
        stride_per_key_per_rank=kjt.stride_per_key_per_rank() if variable else None,
    )
    assert kjt_is_equal(from_offsets, kjt)
    assert from_offsets.offset_per_key()[-1] == kjt.values().numel()
    assert torch.equal(from_offsets.lengths(), kjt.lengths().long())
