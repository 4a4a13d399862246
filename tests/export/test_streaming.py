"""Export a slice of rows at a time, the accuracy gate on the rows its sample reads, and serving that maps the
package's rows instead of copying them."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from recserve.export import accuracy_report, export_package, synthetic_sample
from recserve.export import exporter as exporter_module
from recserve.export.planner import TableLoad, plan_placement
from recserve.export.quantize import quantize_table
from recserve.export.sample_rows import compact_sample
from recserve.runtime import Predictor
from recserve.runtime.layout import TableDType, kernel_rows, row_bytes
from recserve.runtime.package import read_manifest
from tests.export.common import dlrm_config, request, trained_state

CFG = dlrm_config()


def test_rows_written_in_slices_are_the_whole_tables_quantized(tmp_path, monkeypatch):
    monkeypatch.setattr(exporter_module, "_SLICE_BYTES", 37 * 8 * 4)  # 37 rows of dim 8 per slice
    state = trained_state(CFG)
    sample = synthetic_sample(CFG, 128)
    path = export_package(
        tmp_path / "p", model_config=CFG, state_dict=state, devices=["cpu:0", "cpu:1"], accuracy_sample=sample
    )
    manifest = read_manifest(path)
    assert manifest.format_version == 2
    stored = {}
    for index in range(len(manifest.placement.devices)):
        file = path / f"embeddings_{index}.safetensors"
        if file.exists():
            stored.update(load_file(file))
    for shard in manifest.placement.shards:
        weight = state[f"model.sparse_arch.embedding_bag_collection.embedding_bags.{shard.table}.weight"]
        whole = quantize_table(weight, TableDType.INT8)
        expected = kernel_rows(whole.weights, whole.scale_bias)[shard.row_start : shard.row_end]
        assert torch.equal(stored[f"{shard.label}.rows"], expected), shard.label


def test_accuracy_on_the_sampled_rows_is_the_full_models(tmp_path):
    state = trained_state(CFG)
    sample = synthetic_sample(CFG, 256)
    path = export_package(tmp_path / "p", model_config=CFG, state_dict=state, accuracy_sample=sample)
    compact_report = read_manifest(path).accuracy
    tables = {
        t.name: state[f"model.sparse_arch.embedding_bag_collection.embedding_bags.{t.name}.weight"]
        for t in CFG.tables
    }
    quantized = {name: quantize_table(w, TableDType.INT8) for name, w in tables.items()}
    loads = [TableLoad(t.name, t.num_embeddings, row_bytes(8, TableDType.INT8)) for t in CFG.tables]
    dense = {k: v for k, v in state.items() if "embedding_bags" not in k}
    full = accuracy_report(
        CFG, state, tables, quantized, plan_placement(loads, ["cpu"]), dense, "fp32", sample=sample
    )
    for variant in ("package", *full["by_dtype"]):
        ours = compact_report[variant] if variant == "package" else compact_report["by_dtype"][variant]
        theirs = full[variant] if variant == "package" else full["by_dtype"][variant]
        assert ours["auc"] == pytest.approx(theirs["auc"], abs=1e-9)
        assert ours["max_abs_logit_diff"] == pytest.approx(theirs["max_abs_logit_diff"], abs=1e-5)


def test_compact_sample_keeps_shared_ids_consistent():
    sample = synthetic_sample(CFG, 64)
    compact = compact_sample(CFG, sample)
    # f0 is read by t0 and t3: both keep the same rows, so one renumbered id names the same row in both.
    assert torch.equal(compact.rows["t0"], compact.rows["t3"])
    assert all(c.num_embeddings == max(1, compact.rows[c.name].numel()) for c in compact.config.tables)


def test_served_tables_are_the_mapped_package_files(tmp_path):
    path = export_package(
        tmp_path / "p",
        model_config=CFG,
        state_dict=trained_state(CFG),
        devices=["cpu:0", "cpu:1"],
        accuracy_sample=synthetic_sample(CFG, 128),
    )
    predictor = Predictor.load(path)
    kernels = [lookup.tbe for lookup in predictor.model.model.sparse_arch.embedding_bag_collection._lookups]
    sizes = {(path / f"embeddings_{i}.safetensors").stat().st_size for i in range(2)}
    assert kernels and all(k.weights_host.numel() in sizes for k in kernels), "kernels read the mapped files"
    # A package of format 1 (weights and scale/bias stored apart) still loads, copied into the kernels.
    manifest = json.loads((path / "manifest.json").read_text())
    for index in range(2):
        file = path / f"embeddings_{index}.safetensors"
        tensors = load_file(file)
        split = {}
        for name, rows in tensors.items():
            label = name.removesuffix(".rows")
            split[f"{label}.weights"], split[f"{label}.scale_bias"] = rows[:, 4:].clone(), rows[:, :4].clone()
        save_file(split, file)
    (path / "manifest.json").write_text(json.dumps({**manifest, "format_version": 1}))
    legacy = Predictor.load(path, verify=False)
    dense, kjt = request(CFG, batch=16)
    assert torch.equal(legacy.predict(dense, kjt), predictor.predict(dense, kjt))
