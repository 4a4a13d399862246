"""QuantEmbeddingBagCollection gives the training collection's outputs, however its tables are placed."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recserve.export.planner import TableLoad, plan_placement
from recserve.export.quantize import dequantize_table, quantize_table
from recserve.runtime.layout import TableDType, row_bytes
from recserve.runtime.placement import ServingPlacement, TableShard
from recserve.runtime.quant_embedding import QuantEmbeddingBagCollection, split_by_placement
from rectrain import EmbeddingBagCollection
from tests.export.common import dlrm_config, request

CFG = dlrm_config()


def _split_everywhere(fractions: list[float]) -> ServingPlacement:
    """Each table cut at ``fraction`` of its rows: the first part on cpu:1, the rest on cpu:0."""
    shards = []
    for table, fraction in zip(CFG.tables, fractions):
        cut = int(table.num_embeddings * fraction)
        if cut > 0:
            shards.append(TableShard(table.name, "cpu:1", 0, cut))
        if cut < table.num_embeddings:
            shards.append(TableShard(table.name, "cpu:0", cut, table.num_embeddings))
    return ServingPlacement(["cpu:0", "cpu:1"], "cpu:0", shards)


PLACEMENTS = {
    "one device": lambda dtype: _planned(["cpu"], dtype),
    "two devices, table-wise": lambda dtype: _planned(["cpu:0", "cpu:1"], dtype),
    "two devices, every table split": lambda dtype: _split_everywhere([0.5, 0.3, 0.7, 0.01]),
}


def _reference(dtype: TableDType) -> tuple[EmbeddingBagCollection, dict]:
    """A training collection holding exactly the values the quantized tables dequantize to."""
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(CFG.tables)
    quantized = {}
    for table in CFG.tables:
        weight = ebc.embedding_bags[table.name].weight
        quantized[table.name] = quantize_table(torch.randn(weight.shape) * 0.5, dtype)
        with torch.no_grad():
            weight.copy_(dequantize_table(quantized[table.name]))
    return ebc, quantized


def _planned(devices: list[str], dtype: TableDType) -> ServingPlacement:
    loads = [
        TableLoad(t.name, t.num_embeddings, row_bytes(t.embedding_dim, dtype), t.num_features)
        for t in CFG.tables
    ]
    return plan_placement(loads, devices)


@pytest.mark.parametrize("name", list(PLACEMENTS))
@pytest.mark.parametrize("dtype", [TableDType.FP32, TableDType.INT8, TableDType.INT4])
def test_matches_training_collection(name, dtype):
    ebc, quantized = _reference(dtype)
    placement = PLACEMENTS[name](dtype)
    lookups = QuantEmbeddingBagCollection(CFG.tables, split_by_placement(quantized, placement), placement)
    _, kjt = request(CFG, batch=9)
    with torch.no_grad():
        expected = ebc(kjt)
    got = lookups(kjt)
    assert got.keys() == expected.keys()
    assert got.length_per_key() == expected.length_per_key()
    torch.testing.assert_close(got.values(), expected.values(), rtol=1e-5, atol=1e-5)


@settings(max_examples=20, deadline=None)
@given(
    batch=st.integers(1, 12),
    max_ids=st.integers(0, 5),
    seed=st.integers(0, 1000),
    cuts=st.lists(st.floats(0.0, 1.0), min_size=4, max_size=4),
)
def test_split_placement_equals_single_device(batch, max_ids, seed, cuts):
    _, quantized = _reference(TableDType.INT8)
    one = _planned(["cpu"], TableDType.INT8)
    split = _split_everywhere(cuts)
    single = QuantEmbeddingBagCollection(CFG.tables, split_by_placement(quantized, one), one)
    spread = QuantEmbeddingBagCollection(CFG.tables, split_by_placement(quantized, split), split)
    _, kjt = request(CFG, batch, seed=seed, max_ids=max_ids)
    torch.testing.assert_close(spread(kjt).values(), single(kjt).values(), rtol=1e-6, atol=1e-6)


def test_holds_no_parameters_and_reports_configs():
    _, quantized = _reference(TableDType.INT8)
    placement = _planned(["cpu"], TableDType.INT8)
    lookups = QuantEmbeddingBagCollection(CFG.tables, split_by_placement(quantized, placement), placement)
    assert lookups.state_dict() == {}
    assert lookups.embedding_bag_configs() == CFG.tables
    assert not lookups.is_weighted()
