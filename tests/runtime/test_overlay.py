"""The row overlay, property-tested: for any sets of changed rows (applied in one or two steps, overlapping),
the lookups pool bit for bit what lookups over fully rebuilt tables pool: mixed row widths in one kernel, one
device or a table split over two, weighted or not, with kernels whose tables copy their rows (built in
memory) rather than map them."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from recserve.export import TableLoad, plan_placement, quantize_table
from recserve.runtime import QuantEmbeddingBagCollection
from recserve.runtime.layout import kernel_rows
from recserve.runtime.quant_embedding import split_by_placement
from rectrain.sparse import KeyedJaggedTensor
from tests.export.common import dlrm_config, request

CFG = dlrm_config()
DTYPES = {"t0": "int8", "t1": "fp16", "t2": "int4", "t3": "int8"}
SIZES = {t.name: t.num_embeddings for t in CFG.tables}
PLACEMENTS = {
    "one device": plan_placement([TableLoad(t.name, t.num_embeddings, 1) for t in CFG.tables], ["cpu"]),
    "split": plan_placement(  # t3 split over the two devices, as in tests/runtime/delta_common.py
        [TableLoad(t.name, t.num_embeddings, 12) for t in CFG.tables],
        ["cpu:0", "cpu:1"],
        capacity_bytes={"cpu:0": 250 * 12, "cpu:1": 459 * 12},
    ),
}


def _lookups(weights: dict[str, torch.Tensor], placement, weighted: bool) -> QuantEmbeddingBagCollection:
    tables = {name: quantize_table(w, DTYPES[name]) for name, w in weights.items()}
    shards = split_by_placement(tables, placement)
    return QuantEmbeddingBagCollection(CFG.tables, shards, placement, is_weighted=weighted)


def _changes(draw_sets: dict[str, list[int]], seed: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return {
        name: (torch.tensor(sorted(ids), dtype=torch.int64), torch.randn(len(ids), 8, generator=gen))
        for name, ids in draw_sets.items()
        if ids
    }


def _quantized(changes):
    out = {}
    for name, (ids, values) in changes.items():
        q = quantize_table(values, DTYPES[name])
        out[name] = (ids, kernel_rows(q.weights, q.scale_bias))
    return out


changed_sets = st.fixed_dictionaries(
    {name: st.lists(st.integers(0, n - 1), unique=True, max_size=min(n, 40)) for name, n in SIZES.items()}
)


@settings(max_examples=25)
@given(
    first=changed_sets,
    second=changed_sets,
    placement=st.sampled_from(sorted(PLACEMENTS)),
    weighted=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_overlay_pools_like_rebuilt_tables(first, second, placement, weighted, seed):
    gen = torch.Generator().manual_seed(seed)
    base = {t.name: torch.randn(t.num_embeddings, 8, generator=gen) for t in CFG.tables}
    lookups = _lookups(base, PLACEMENTS[placement], weighted)
    rebuilt = {name: w.clone() for name, w in base.items()}
    for step, sets in enumerate((first, second)):
        changes = _changes(sets, seed + step)
        for name, (ids, values) in changes.items():
            rebuilt[name][ids] = values
        lookups.use_overlays(lookups.overlays_with(_quantized(changes)))
    assert PLACEMENTS["split"].is_split("t3")
    want = _lookups(rebuilt, PLACEMENTS[placement], weighted)
    _, kjt = request(CFG, 16, seed=seed, max_ids=4)
    if weighted:
        weights = torch.rand(kjt.values().numel(), generator=gen)
        kjt = KeyedJaggedTensor(keys=kjt.keys(), values=kjt.values(), lengths=kjt.lengths(), weights=weights)
    with torch.inference_mode():
        assert torch.equal(lookups(kjt).values(), want(kjt).values())
