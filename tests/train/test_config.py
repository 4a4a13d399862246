"""RunConfig: every shipped example loads; bad keys and values are reported with file, key path and type."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rectrain.errors import ConfigError
from rectrain.train.build import build_train_module
from rectrain.train.config import RunConfig, TrainConfig
from rectrain.train.schema import apply_overrides, parse_override, read_section

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

MODEL = """
[model]
kind = "dlrm"
dense_in_features = 13
dense_arch_layer_sizes = [8]
over_arch_layer_sizes = [1]
tables = [{ name = "t0", num_embeddings = 10, embedding_dim = 8, feature_names = ["cat_0"] }]
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(MODEL + text)
    return path


def load_error(tmp_path: Path, text: str, overrides: tuple[str, ...] = ()) -> str:
    with pytest.raises(ConfigError) as e:
        RunConfig.load(write(tmp_path, text), overrides)
    return str(e.value)


@pytest.mark.parametrize("name", sorted(p.name for p in EXAMPLES.glob("*.toml")))
def test_every_shipped_example_loads(name):
    config = RunConfig.load(EXAMPLES / name)
    assert config.source == name
    assert config.model.tables and config.train.batch_size >= 1


def test_the_examples_cover_the_four_documented_runs():
    names = {p.name for p in EXAMPLES.glob("*.toml")}
    assert {"dlrm_synthetic.toml", "dlrm_criteo.toml", "dcn_criteo.toml", "two_tower_movielens.toml"} <= names


def test_sparse_eps_and_weight_decay_reach_the_fused_embedding_optimizer():
    overrides = ["optimizer.sparse_eps=0.001", "optimizer.sparse_weight_decay=0.01"]
    model = build_train_module(RunConfig.load(EXAMPLES / "dlrm_synthetic.toml", overrides))
    groups = [m.fused_optimizer.param_groups[0] for m in model.modules() if hasattr(m, "fused_optimizer")]
    assert groups and all(g["eps"] == 0.001 and g["weight_decay"] == 0.01 for g in groups)
    with pytest.raises(ConfigError, match="optimizer.sparse_eps"):
        RunConfig.load(EXAMPLES / "dlrm_synthetic.toml", ["optimizer.sparse_eps=0.0"])


def test_a_bad_type_names_file_key_and_expected_type(tmp_path):
    message = load_error(tmp_path, '[train]\nsteps = 5\nbatch_size = "abc"\n')
    assert message == "run.toml: train.batch_size: expected a positive int, got 'abc'"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[train]\nsteps = 0\n", "run.toml: train.steps: expected a positive int, got 0"),
        ("[train]\nsteps = 5\npipeline = 1\n", "train.pipeline: expected a bool (true or false), got 1"),
        ("[train]\nsteps = 5\n[data]\nsource = 'hdf5'\n", "data.source: expected one of 'synthetic'"),
        ("[train]\nsteps = 5\n[optimizer]\nsparse_lr = -1.0\n", "optimizer.sparse_lr: expected a positive"),
        ("[train]\nsteps = 5\n[data]\npaths = 'a.tsv'\n", "data.paths: expected a list of strings"),
        ("[train]\nsteps = 5\neval_every = -1\n", "train.eval_every: expected a non-negative int, got -1"),
    ],
)
def test_value_errors_name_the_key(tmp_path, text, expected):
    assert expected in load_error(tmp_path, text)


def test_unknown_keys_are_errors_with_a_did_you_mean(tmp_path):
    message = load_error(tmp_path, "[train]\nsteps = 5\nbach_size = 8\n")
    assert message.startswith("run.toml: train.bach_size: unknown key (did you mean 'batch_size'?)")
    assert "known keys:" in message
    assert "did you mean 'train'" in load_error(tmp_path, "[trian]\nsteps = 5\n")


def test_model_errors_carry_the_file_name(tmp_path):
    path = tmp_path / "run.toml"
    path.write_text(MODEL.replace("embedding_dim = 8", 'embedding_dim = "x"') + "[train]\nsteps = 1\n")
    with pytest.raises(ConfigError, match=r"^run\.toml: model\.tables\[0\]\.embedding_dim"):
        RunConfig.load(path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("[train]\n", "train: give steps (an int) or epochs (an int)"),
        ("[train]\nsteps = 1\nepochs = 1\n", "train: give steps or epochs, not both"),
        ("[train]\nsteps = 1\n[data]\nsource = 'criteo'\n", "data.paths: criteo needs at least one file"),
        ("[train]\nsteps = 1\n[checkpoint]\nevery_n_steps = 5\n", "checkpoint.every_n_steps is set but"),
        ("[train]\nsteps = 1\n[planner]\nsharding_types = ['diagonal']\n", "'diagonal' is not one of"),
    ],
)
def test_cross_key_checks(tmp_path, text, expected):
    assert expected in load_error(tmp_path, text)


def test_overrides_set_values_as_toml_and_bare_words(tmp_path):
    path = write(tmp_path, "[train]\nsteps = 5\n")
    config = RunConfig.load(path, ["train.steps=50", "data.source=synthetic", "train.pipeline=false"])
    assert (config.train.steps, config.data.source, config.train.pipeline) == (50, "synthetic", False)
    assert parse_override('data.paths=["a.tsv", "b.tsv"]') == (["data", "paths"], ["a.tsv", "b.tsv"])


@pytest.mark.parametrize(
    ("text", "override", "expected"),
    [
        ("[train]\nepochs = 1\n", "train.steps=50", (50, None)),
        ("[train]\nsteps = 5\n", "train.epochs=2", (None, 2)),
        ("[train]\nsteps = 5\n", "train.steps=7", (7, None)),
    ],
)
def test_run_length_override_replaces_the_files_steps_or_epochs(tmp_path, text, override, expected):
    config = RunConfig.load(write(tmp_path, text), [override])
    assert (config.train.steps, config.train.epochs) == expected


def test_shipped_examples_accept_a_steps_override():
    for path in sorted(Path(__file__).parents[2].joinpath("examples").glob("*.toml")):
        assert RunConfig.load(path, ["train.steps=50"]).train.steps == 50, path.name


def test_bad_overrides_are_reported(tmp_path):
    assert "train.steps: expected a positive int, got 'many'" in load_error(
        tmp_path, "[train]\nsteps = 5\n", ("train.steps=many",)
    )
    with pytest.raises(ConfigError, match="expected section.key=value"):
        parse_override("train.steps")
    with pytest.raises(ConfigError, match="train.steps is a value, not a table"):
        apply_overrides({"train": {"steps": 1}}, ["train.steps.x=1"])


def test_missing_file_and_invalid_toml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        RunConfig.load(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[train\n")
    with pytest.raises(ConfigError, match="bad.toml: not valid TOML"):
        RunConfig.load(bad)


@given(st.one_of(st.integers(-5, 5), st.floats(allow_nan=False), st.text(max_size=3), st.booleans()))
def test_batch_size_is_accepted_exactly_when_a_positive_int(value):
    valid = isinstance(value, int) and not isinstance(value, bool) and value >= 1
    if valid:
        assert read_section(TrainConfig, {"batch_size": value}, where="train", source="r").batch_size == value
    else:
        with pytest.raises(ConfigError, match=r"^r: train\.batch_size: expected a positive int, got "):
            read_section(TrainConfig, {"batch_size": value}, where="train", source="r")
