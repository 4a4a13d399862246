"""DeltaStoreTrec: batches' lookups per table, compacted to unique ids keeping each id's first or last state,
checked against a plain dictionary walk over the same batches."""

import pytest
import torch

from rectrain.distributed.model_tracker.delta_store import DeltaStoreTrec
from rectrain.distributed.model_tracker.types import UpdateMode


def _batches() -> list[tuple[int, torch.Tensor]]:
    generator = torch.Generator().manual_seed(3)
    return [(i, torch.randint(0, 12, (6,), generator=generator)) for i in range(5)]


def _expected(batches, mode: UpdateMode) -> dict[int, float]:
    kept: dict[int, float] = {}
    for batch_idx, ids in batches:
        for position, row in enumerate(ids.tolist()):
            if mode == UpdateMode.LAST or row not in kept:
                kept[row] = float(batch_idx * 100 + position)
    return kept


@pytest.mark.parametrize("mode", [UpdateMode.FIRST, UpdateMode.LAST])
def test_compacted_ranges_keep_each_ids_first_or_last_state(mode: UpdateMode) -> None:
    store = DeltaStoreTrec(mode)
    batches = _batches()
    for batch_idx, ids in batches:
        states = batch_idx * 100 + torch.arange(ids.numel(), dtype=torch.float)
        store.append(batch_idx, "ebc.t1", ids, states.unsqueeze(1))
    store.compact(1, 4)  # batches 1..3 become one lookup at index 1
    assert [x.batch_idx for x in store.per_fqn_lookups["ebc.t1"]] == [0, 1, 4]
    rows = store.get_unique()["ebc.t1"]
    got = dict(zip(rows.ids.tolist(), rows.states.squeeze(1).tolist()))
    assert got == _expected(batches, mode)
    assert sorted(store.get_unique(from_idx=4)["ebc.t1"].ids.tolist()) == sorted(set(batches[4][1].tolist()))


def test_ids_only_and_delete() -> None:
    store = DeltaStoreTrec()
    for batch_idx, ids in _batches():
        store.append(batch_idx, "t", ids)
    assert store.get_unique()["t"].ids.tolist() == sorted({r for _, ids in _batches() for r in ids.tolist()})
    store.delete(up_to_idx=3)
    assert [x.batch_idx for x in store.per_fqn_lookups["t"]] == [3, 4]
    store.delete()
    assert store.get_unique() == {}
