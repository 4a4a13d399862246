"""``recserve export --prune``: each policy keeps the rows it names, pruned ids serve the documented vector
(zero, or the mean of the table's pruned rows) through FBGEMM's remap in the int-N kernel, the accuracy gate
measures the pruned package, and the remap is part of the package's integrity checks."""

from __future__ import annotations

import json
import math

import pytest
import torch

from recserve.cli import main
from recserve.errors import AccuracyError, ExportError, PackageError
from recserve.export import export_package
from recserve.export.prune import PrunePolicy
from recserve.export.quantize import dequantize_table, quantize_table
from recserve.runtime import Predictor, QuantEmbeddingBagCollection
from recserve.runtime.package import load_remaps, load_shards, read_manifest
from recserve.runtime.pruning import REMAP_FILE
from rectrain.durable import sha256_file
from rectrain.sparse import KeyedJaggedTensor
from tests.export.common import dlrm_config, request, trained_state

CFG = dlrm_config()
STATE = trained_state(CFG)
COUNTS = {
    t.name: torch.randint(
        0, 12, (t.num_embeddings,), dtype=torch.int32, generator=torch.Generator().manual_seed(i)
    )
    for i, t in enumerate(CFG.tables)
}
WEIGHT = "model.sparse_arch.embedding_bag_collection.embedding_bags.{}.weight"


def _export(out, policy: str, default: str = "zero", **options):
    options = {"force": True, **options}
    return export_package(
        out, model_config=CFG, state_dict=STATE, prune=PrunePolicy.parse(policy, default), row_counts=COUNTS,
        **options,
    )  # fmt: skip


def _expected_keep(policy: str, table) -> torch.Tensor:
    """The rows ``policy`` keeps, computed here from the counts or norms."""
    kind, value = policy.split(":")
    if kind == "count":
        return COUNTS[table.name] >= int(value)
    scores = COUNTS[table.name] if kind == "top" else STATE[WEIGHT.format(table.name)].norm(dim=1)
    kept = math.ceil(float(value) * table.num_embeddings)
    threshold = scores.double().sort(descending=True).values[kept - 1]
    keep = torch.zeros(table.num_embeddings, dtype=torch.bool)
    keep[torch.sort(scores.double(), descending=True, stable=True).indices[:kept]] = True
    assert bool((scores[keep] >= threshold).all()) and bool((scores[~keep] <= threshold).all())
    return keep


def _one_id_per_bag(feature: str, rows: int) -> KeyedJaggedTensor:
    """Every id of ``feature`` in a bag of its own (the other features' bags empty)."""
    keys = list(dict.fromkeys(f for t in CFG.tables for f in t.feature_names))
    lengths = torch.zeros(len(keys), rows, dtype=torch.long)
    lengths[keys.index(feature)] = 1
    return KeyedJaggedTensor.from_lengths_sync(
        keys=keys, values=torch.arange(rows), lengths=lengths.reshape(-1)
    )


@pytest.mark.parametrize("default", ["zero", "mean"])
@pytest.mark.parametrize("policy", ["count:4", "top:0.3", "norm:0.4"])
def test_pruned_ids_serve_the_documented_vector(tmp_path, policy, default):
    path = _export(tmp_path / "pkg", policy, default)
    manifest = read_manifest(path)
    lookups = QuantEmbeddingBagCollection(
        CFG.tables, load_shards(path, manifest), manifest.placement, remaps=load_remaps(path, manifest)
    )
    assert manifest.pruning["policy"] == policy and manifest.pruning["default"] == default
    for table in CFG.tables:  # t1 is read by f1 and g1, f0 by t0 and t3, t2 pools MEAN
        keep = _expected_keep(policy, table)
        assert 0 < int(keep.sum()) < table.num_embeddings
        assert manifest.pruning["tables"][table.name]["kept"] == int(keep.sum())
        weight = STATE[WEIGHT.format(table.name)]
        served = dequantize_table(quantize_table(weight, "int8"))
        mean = weight[~keep].double().mean(0).float() if default == "mean" else torch.zeros(weight.shape[1])
        served[~keep] = dequantize_table(quantize_table(mean.unsqueeze(0), "int8"))
        for feature in table.feature_names:
            rows = min(t.num_embeddings for t in CFG.tables if feature in t.feature_names)  # f0: t0 and t3
            pooled = lookups(_one_id_per_bag(feature, rows))
            keys = pooled.keys()
            got = pooled[feature if feature in keys else f"{feature}@{table.name}"]
            torch.testing.assert_close(got, served[:rows], rtol=0, atol=1e-6, msg=f"{table.name} {feature}")


def test_the_gate_measures_the_pruned_package_and_refuses_past_max_auc_drop(tmp_path):
    path = _export(tmp_path / "pkg", "top:0.5", max_auc_drop=1.0, force=False)
    manifest = read_manifest(path)
    assert manifest.pruning["auc_drop"] == -manifest.accuracy["package"]["auc_diff"]
    assert manifest.pruning["auc_drop"] > -manifest.accuracy["by_dtype"]["int8"]["auc_diff"]  # pruning costs
    assert manifest.format_version == 3 and REMAP_FILE in manifest.files
    unpruned = sum(t.nbytes for t in read_manifest(export_package(
        tmp_path / "full", model_config=CFG, state_dict=STATE, force=True)).tables)  # fmt: skip
    assert sum(t.nbytes for t in manifest.tables) < 0.6 * unpruned
    with pytest.raises(AccuracyError, match="pruned and quantized model loses .* keep more rows"):
        _export(tmp_path / "refused", "top:0.05", max_auc_drop=0.001, force=False)
    assert not (tmp_path / "refused").exists()


def test_the_remap_is_verified_and_bounded(tmp_path):
    path = _export(tmp_path / "pkg", "count:4", "mean")
    dense, kjt = request(CFG, 8)
    Predictor.load(path).predict(dense, kjt)
    remap_file = path / REMAP_FILE
    from safetensors.torch import load_file, save_file

    remaps = load_file(str(remap_file))
    key = next(iter(remaps))
    remaps[key][0] = 10**6  # a row past the shard's stored rows
    save_file(remaps, str(remap_file), metadata={"format": "pt"})
    with pytest.raises(PackageError, match=r"remap\.safetensors: (sha256|\d+ bytes)"):
        Predictor.load(path)
    manifest = json.loads((path / "manifest.json").read_text())
    manifest["files"][REMAP_FILE] = {"sha256": sha256_file(remap_file), "bytes": remap_file.stat().st_size}
    (path / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(PackageError, match=r"entries must be -1 or a stored row"):
        Predictor.load(path)


def test_count_policies_need_row_counts(tmp_path):
    with pytest.raises(ExportError, match="table 't0' has no row counts.*norm:F"):
        export_package(tmp_path / "p", model_config=CFG, state_dict=STATE, prune=PrunePolicy.parse("top:0.5"))


@pytest.mark.parametrize(
    "value", ["bogus", "count", "count:0", "count:2.5", "top:0", "top:1.5", "norm:x", "size:0.3"]
)
def test_a_bad_prune_value_is_one_clear_line(tmp_path, capsys, value):
    with pytest.raises(ExportError, match=r"^--prune .*expected|^--prune .*needs"):
        PrunePolicy.parse(value)
    code = main(["export", "--checkpoint", str(tmp_path), "--out", str(tmp_path / "o"), "--prune", value])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"--prune {value!r}" in err


def test_a_pruned_package_refuses_delta_rows(tmp_path):
    path = _export(tmp_path / "pkg", "norm:0.5")
    manifest = read_manifest(path)
    lookups = QuantEmbeddingBagCollection(
        CFG.tables, load_shards(path, manifest), manifest.placement, remaps=load_remaps(path, manifest)
    )
    rows = torch.zeros(1, 12, dtype=torch.uint8)  # one int8 kernel row of dim 8
    with pytest.raises(PackageError, match=r"\['t1'\]: a pruned package takes no deltas"):
        lookups.overlays_with({"t1": (torch.tensor([3]), rows)})
