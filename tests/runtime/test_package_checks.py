"""Hand-corrupted package manifests and shard files are refused at load, naming the file and the field,
before anything reaches FBGEMM (the manifest has no checksum of its own, so its sizes are checked)."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from recserve.errors import PackageError
from recserve.export import export_package, synthetic_sample
from recserve.runtime import Predictor
from tests.export.common import dlrm_config, trained_state

CFG = dlrm_config()


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    return export_package(
        tmp_path_factory.mktemp("pkg") / "p",
        model_config=CFG,
        state_dict=trained_state(CFG),
        devices=["cpu:0", "cpu:1"],
        accuracy_sample=synthetic_sample(CFG, 64),
    )


@pytest.fixture
def copy(tmp_path, package):
    return shutil.copytree(package, tmp_path / "copy")


def _shard(data, table):
    return next(s for s in data["placement"]["shards"] if s["table"] == table)


def _table(data, name):
    return next(t for t in data["tables"] if t["name"] == name)


def _config_table(data, name):
    return next(t for t in data["model_config"]["tables"] if t["name"] == name)


EDITS = {
    "shard ends early": (
        lambda d: _shard(d, "t0").update(row_end=250),
        r"placement: the shards of table 't0' cover rows \[0, 250\) of \[0, 300\)",
    ),
    "shard twice": (
        lambda d: d["placement"]["shards"].append(dict(_shard(d, "t1"))),
        r"placement\.shards\[4\] \(t1\[0:200\]\): overlaps the shard before it",
    ),
    "shard starts late": (
        lambda d: _shard(d, "t2").update(row_start=10),
        r"placement\.shards\[2\] \(t2\[10:120\]\): leaves a gap before it",
    ),
    "shard past the table": (
        lambda d: _shard(d, "t3").update(row_end=2**62),
        r"placement\.shards\[3\] \(t3\[0:4611686018427387904\] on cpu:\d\): rows must satisfy .* <= 80",
    ),
    "negative start": (
        lambda d: _shard(d, "t3").update(row_start=-(2**63)),
        r"placement\.shards\[3\] .*: rows must satisfy 0 <= row_start",
    ),
    "unknown device": (
        lambda d: _shard(d, "t0").update(device="cuda:7"),
        r"placement\.shards\[0\] \(t0\[0:300\] on cuda:7\): device is not one of placement\.devices",
    ),
    "rows disagree": (
        lambda d: _table(d, "t1").update(num_embeddings=2**40),
        r"tables\[1\] \('t1'\): num_embeddings, embedding_dim = \(1099511627776, 8\), but model_config says "
        r"\(200, 8\)",
    ),
    "config rows grow": (
        lambda d: _config_table(d, "t2").update(num_embeddings=10**6),
        r"tables\[2\] \('t2'\): .* model_config says \(1000000, 8\)",
    ),
    "table missing": (
        lambda d: d["tables"].pop(),
        r"tables: model_config's tables \['t3'\] are missing",
    ),
    "dense width": (lambda d: d.update(dense_in_features=7), r"dense_in_features 7, but model_config says 5"),
    "features": (lambda d: d["feature_names"].reverse(), r"feature_names .* but model_config reads"),
    "dtype": (
        lambda d: _table(d, "t0").update(dtype="int4"),
        r"embeddings_\d\.safetensors: t0\[0:300\]: int4 table of dim 8 needs uint8 weights \[300, 4\]",
    ),
}


@pytest.mark.parametrize("edit", list(EDITS))
def test_corrupted_manifest_is_named(copy, edit):
    change, message = EDITS[edit]
    manifest = copy / "manifest.json"
    data = json.loads(manifest.read_text())
    change(data)
    manifest.write_text(json.dumps(data))
    where = "" if "safetensors" in message else r"manifest\.json: "  # a shard file, or the manifest
    with pytest.raises(PackageError, match=where + message):
        Predictor.load(copy)


@pytest.mark.parametrize(
    ("replace", "message"),
    [
        (
            lambda t: t[:-1],
            r"int8 table of dim 8 needs uint8 weights \[300, 8\] .* got weights \(299, 8\) torch\.uint8",
        ),
        (lambda t: t.float(), r"has no tensor 't0\[0:300\]\.rows'"),
        (lambda t: t[:, :4], r".* got weights \(300, 0\) torch\.uint8"),
    ],
    ids=["one row short", "float bytes", "narrow rows"],
)
def test_shard_tensor_that_does_not_fit_its_placement_is_named(copy, replace, message):
    data = json.loads((copy / "manifest.json").read_text())
    index = data["placement"]["devices"].index(_shard(data, "t0")["device"])
    path = copy / f"embeddings_{index}.safetensors"
    tensors = load_file(path)
    # A shard is stored as the kernel's rows: 4 bytes of scale/bias, then the dim-8 int8 codes.
    tensors["t0[0:300].rows"] = replace(tensors["t0[0:300].rows"]).contiguous()
    save_file(tensors, path)
    where = rf"embeddings_{index}\.safetensors: " + ("" if "has no tensor" in message else r"t0\[0:300\]: ")
    with pytest.raises(PackageError, match=where + message):
        Predictor.load(copy, verify=False)  # with verify, the checksum refuses it first


def _set_files(copy, files) -> None:
    path = copy / "manifest.json"
    data = json.loads(path.read_text())
    data["files"] = files
    path.write_text(json.dumps(data))


def test_a_manifest_without_files_is_refused_not_trusted(copy):
    # The reported attack: altered table bytes beside an empty 'files' map loaded and changed scores.
    (copy / "embeddings_0.safetensors").write_bytes(
        b"\0" * 64 + (copy / "embeddings_0.safetensors").read_bytes()[64:]
    )
    _set_files(copy, {})
    with pytest.raises(PackageError, match="'files' lists no file"):
        Predictor.load(copy)


def test_an_unlisted_file_or_folder_is_refused(copy):
    (copy / "extra.safetensors").write_bytes(b"x")
    with pytest.raises(PackageError, match=r"extra.safetensors: not listed in manifest.json"):
        Predictor.load(copy)
    (copy / "extra.safetensors").unlink()
    (copy / "sub").mkdir()
    with pytest.raises(PackageError, match=r"sub: not listed in manifest.json"):
        Predictor.load(copy)


def test_a_listed_file_that_is_missing_or_outside_the_package_is_refused(copy):
    data = json.loads((copy / "manifest.json").read_text())
    files = dict(data["files"])
    (copy / "embeddings_1.safetensors").unlink()
    with pytest.raises(PackageError, match=r"embeddings_1.safetensors: missing \(listed in manifest.json\)"):
        Predictor.load(copy)
    _set_files(copy, {**files, "../escape": files["dense.safetensors"]})
    with pytest.raises(PackageError, match=r"files\['../escape'\]: not a file name inside the package"):
        Predictor.load(copy)
