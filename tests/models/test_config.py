"""ModelConfig: dict round trip (property test), and every error names the key path and what was expected."""

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rectrain import EmbeddingBagConfig
from rectrain.errors import ConfigError
from rectrain.models import ModelConfig


def _tables(n=3, dim=4):
    return [
        EmbeddingBagConfig(name=f"t{i}", num_embeddings=10 + i, embedding_dim=dim, feature_names=[f"f{i}"])
        for i in range(n)
    ]


def dlrm_dict(**overrides):
    cfg = ModelConfig(
        kind="dlrm",
        tables=_tables(),
        dense_in_features=5,
        dense_arch_layer_sizes=[8, 4],
        over_arch_layer_sizes=[4, 1],
    )
    d = cfg.to_dict()
    d.update(overrides)
    return d


_sizes = st.lists(st.integers(1, 64), min_size=0, max_size=3)


@st.composite
def model_configs(draw):
    kind = draw(st.sampled_from(["dlrm", "dlrm_dcn", "two_tower"]))
    dim = draw(st.integers(1, 16))
    num_tables = draw(st.integers(2, 4))
    tables = [
        EmbeddingBagConfig(
            name=f"table_{i}",
            num_embeddings=draw(st.integers(1, 10**6)),
            embedding_dim=dim if kind != "two_tower" else draw(st.integers(1, 16)),
            feature_names=[f"f{i}_{j}" for j in range(draw(st.integers(1, 2)))],
            pooling=draw(st.sampled_from(["SUM", "MEAN"])),
            weight_init_max=draw(st.none() | st.floats(0.5, 1.0)),
        )
        for i in range(num_tables)
    ]
    if kind == "two_tower":
        names = [f for t in tables for f in t.feature_names]
        split = draw(st.integers(1, len(names) - 1))
        return ModelConfig(
            kind=kind,
            tables=tables,
            dense_in_features=0,
            query_features=names[:split],
            candidate_features=names[split:],
            tower_layer_sizes=[*draw(_sizes), draw(st.integers(1, 64))],
        )
    return ModelConfig(
        kind=kind,
        tables=tables,
        dense_in_features=draw(st.integers(1, 100)),
        dense_arch_layer_sizes=[*draw(_sizes), dim],
        over_arch_layer_sizes=[*draw(_sizes), 1],
        dcn_num_layers=draw(st.integers(1, 4)),
        dcn_low_rank_dim=draw(st.integers(1, 128)),
    )


@given(model_configs())
def test_to_dict_from_dict_round_trip_through_json(cfg):
    d = json.loads(json.dumps(cfg.to_dict()))
    assert ModelConfig.from_dict(d) == cfg
    assert ModelConfig.from_dict(d).to_dict() == cfg.to_dict()


def test_table_dicts_carry_the_agreed_keys():
    table = dlrm_dict()["tables"][1]
    assert table["name"] == "t1" and table["num_embeddings"] == 11 and table["embedding_dim"] == 4
    assert table["feature_names"] == ["f1"] and table["pooling"] == "SUM"


@pytest.mark.parametrize(
    "mutate, message",
    [
        (
            lambda d: d["tables"][2].update(embedding_dim="x"),
            "model.tables[2].embedding_dim: expected int, got 'x'",
        ),
        (
            lambda d: d["tables"][0].update(num_embeddings=0),
            "model.tables[0].num_embeddings: expected an int >= 1",
        ),
        (
            lambda d: d["tables"][1].update(pooling="MAX"),
            "model.tables[1].pooling: expected one of ['SUM', 'MEAN']",
        ),
        (
            lambda d: d["tables"][1].update(feature_names="f1"),
            "model.tables[1].feature_names: expected a list",
        ),
        (lambda d: d["tables"][1].update(colour=3), "model.tables[1].colour: unknown key"),
        (lambda d: d["tables"][1].pop("name"), "model.tables[1].name: missing"),
        (lambda d: d["tables"][1].update(name=""), "model.tables[1].name: expected a non-empty table name"),
        (
            lambda d: d["tables"][1].update(name="t0"),
            "model.tables[1].name: 't0' is used by an earlier table",
        ),
        (
            lambda d: d.update(kind="wide_deep"),
            "model.kind: expected one of ['dlrm', 'dlrm_dcn', 'two_tower']",
        ),
        (lambda d: d.update(dense_in_features=True), "model.dense_in_features: expected int, got bool"),
        (lambda d: d.update(dense_in_features=0), "model.dense_in_features: expected an int >= 1, got 0"),
        (
            lambda d: d.update(dense_arch_layer_sizes=[8, "4"]),
            "model.dense_arch_layer_sizes[1]: expected int",
        ),
        (
            lambda d: d.update(dense_arch_layer_sizes=[8, 6]),
            "dense_arch_layer_sizes[-1]: expected the tables' em",
        ),
        (lambda d: d.update(over_arch_layer_sizes=[4, 2]), "model.over_arch_layer_sizes[-1]: expected 1"),
        (
            lambda d: d.update(over_arch_layer_sizes=[]),
            "model.over_arch_layer_sizes: expected a non-empty list",
        ),
        (lambda d: d.update(dcn_num_layers=0, kind="dlrm_dcn"), "model.dcn_num_layers: expected an int >= 1"),
        (lambda d: d.update(tables={}), "model.tables: expected a list of tables, got dict"),
        (lambda d: d.update(tables=[]), "model.tables: expected a non-empty list of tables"),
        (lambda d: d.update(towers=1), "model.towers: unknown key"),
        (lambda d: d.pop("kind"), "model.kind: missing"),
    ],
)
def test_errors_name_the_key_path(mutate, message):
    d = dlrm_dict()
    mutate(d)
    with pytest.raises(ConfigError) as info:
        ModelConfig.from_dict(d)
    assert message in str(info.value)


def test_where_prefixes_every_message():
    with pytest.raises(ConfigError, match=r"^run\.model\.tables\[0\]\.embedding_dim: expected int"):
        ModelConfig.from_dict(
            dlrm_dict(tables=[{"name": "a", "num_embeddings": 3, "embedding_dim": 2.5}]), "run.model"
        )
    with pytest.raises(ConfigError, match=r"^run\.model\.over_arch_layer_sizes\[-1\]: expected 1"):
        ModelConfig.from_dict(dlrm_dict(over_arch_layer_sizes=[3]), "run.model")


def test_dlrm_tables_must_share_one_dim():
    tables = _tables() + [EmbeddingBagConfig(name="wide", num_embeddings=5, embedding_dim=8)]
    with pytest.raises(
        ConfigError, match=r"model\.tables: dlrm needs one embedding_dim for all tables, got \[4, 8\]"
    ):
        ModelConfig(
            kind="dlrm",
            tables=tables,
            dense_in_features=3,
            dense_arch_layer_sizes=[4],
            over_arch_layer_sizes=[1],
        )


def test_two_tower_defaults_to_the_first_two_tables_features():
    cfg = ModelConfig(kind="two_tower", tables=_tables(2), dense_in_features=0, tower_layer_sizes=[8])
    assert cfg.tower_features() == (["f0"], ["f1"])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (dict(dense_in_features=4), "model.dense_in_features: two_tower reads no dense features, expected 0"),
        (dict(tower_layer_sizes=[]), "model.tower_layer_sizes: expected a non-empty list"),
        (
            dict(query_features=["f0"], candidate_features=["nope"]),
            "model.candidate_features[0]: 'nope' is not a",
        ),
        (
            dict(query_features=["f0"], candidate_features=[]),
            "model.candidate_features: expected at least one",
        ),
        (dict(query_features=["f0"], candidate_features=["f0", "f1"]), "share ['f0']"),
        (dict(tables=_tables(3)), "give them, or exactly 2 tables (query, candidate) to default to; got 3"),
    ],
)
def test_two_tower_errors_name_the_key(overrides, message):
    args = dict(kind="two_tower", tables=_tables(2), dense_in_features=0, tower_layer_sizes=[8])
    args.update(overrides)
    with pytest.raises(ConfigError) as info:
        ModelConfig(**args)
    assert message in str(info.value)
