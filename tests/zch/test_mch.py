"""MCHManagedCollisionModule: remapping, training vs eval, state in buffers (checkpointed), shards."""

import pytest
import torch

from rectrain.sparse import JaggedTensor
from rectrain.zch.eviction import DistanceLFU_EvictionPolicy, LFU_EvictionPolicy
from rectrain.zch.mch import MCHManagedCollisionModule


def _module(size=6, interval=1, **kwargs):
    return MCHManagedCollisionModule(
        zch_size=size,
        device=torch.device("cpu"),
        eviction_policy=DistanceLFU_EvictionPolicy(),
        eviction_interval=interval,
        **kwargs,
    )


def _jt(ids):
    return {"f": JaggedTensor(values=torch.tensor(ids), lengths=torch.tensor([len(ids) - 1, 1]))}


def test_resident_ids_get_their_rows_and_the_rest_the_miss_row():
    module = _module()
    first = module(_jt([100, 200, 300]))["f"]
    # Eviction runs after the history is recorded and before remapping: the ids are resident at once.
    rows = first.values().tolist()
    assert len(set(rows)) == 3 and all(0 <= r < 5 for r in rows) and first.lengths().tolist() == [2, 1]
    module.eval()
    again = module(_jt([300, 999, 100]))["f"].values().tolist()
    assert again == [rows[2], 5, rows[0]]  # 999 is unknown: the miss row (zch_size - 1)


def test_eval_does_not_change_the_table():
    module = _module()
    module(_jt([1, 2]))
    module.eval()
    state = {k: v.clone() for k, v in module.state_dict().items()}
    module(_jt([7, 8, 9]))
    for key, value in module.state_dict().items():
        assert torch.equal(value, state[key]), key
    assert module.evict() is not None  # the training step's rows, not the eval's
    assert module.evict() is None


def test_state_dict_round_trip_resumes_the_mapping_and_the_step_count():
    trained = _module(interval=2)
    for ids in ([1, 2, 3], [1, 2, 4], [5, 1, 2], [6, 6, 6]):
        trained(_jt(ids))
    state = trained.state_dict()
    assert set(state) == {
        "_output_segments_tensor",
        "_current_iter_tensor",
        "_mch_sorted_raw_ids",
        "_mch_remapped_ids_mapping",
        "_mch_counts",
        "_mch_last_access_iter",
    }
    restored = _module(interval=2)
    restored.load_state_dict(state)
    trained.eval(), restored.eval()
    probe = _jt([1, 2, 3, 4, 5, 6])
    assert torch.equal(trained(probe)["f"].values(), restored(probe)["f"].values())
    restored.train()
    restored(_jt([9, 9, 9]))
    assert int(restored._current_iter_tensor) == 5


def test_loading_a_checkpoint_of_another_shard_range_is_refused():
    whole = _module(size=6)
    shard = whole.rebuild_with_output_id_range((3, 6), output_segments=[0, 3, 6])
    state = whole.state_dict()
    state = {k: v for k, v in state.items() if k != "_mch_sorted_raw_ids"}
    with pytest.raises(ValueError, match=r"rows \[3, 6\)"):
        shard.load_state_dict(
            {
                **state,
                "_mch_sorted_raw_ids": torch.zeros(3, dtype=torch.int64),
                "_mch_remapped_ids_mapping": torch.arange(3, 6),
                "_mch_counts": torch.zeros(3, dtype=torch.int64),
                "_mch_last_access_iter": torch.zeros(3, dtype=torch.int64),
            }
        )


def test_a_shard_maps_into_its_own_rows():
    shard = _module(size=6).rebuild_with_output_id_range((6, 12), output_segments=[0, 6, 12])
    assert shard.output_size() == 6 and shard.buckets() == 2
    rows = shard(_jt([10, 11, 12]))["f"].values()
    assert len(set(rows.tolist())) == 3 and all(6 <= r < 11 for r in rows.tolist())
    shard.eval()
    assert shard(_jt([1, 2]))["f"].values().tolist() == [11, 11]


def test_input_hash_func_runs_before_remapping():
    module = _module(input_hash_size=10, input_hash_func=lambda ids, size: ids % size)
    module(_jt([13, 23, 5]))
    module.eval()
    assert module(_jt([3, 33]))["f"].values().tolist() == module(_jt([13, 3]))["f"].values().tolist()


def test_open_slots_counts_rows_not_holding_an_id():
    module = _module(size=6)
    assert module.open_slots().item() == 5  # the miss row is never open
    module(_jt([1, 2]))
    assert module.open_slots().item() == 3


def test_eval_module_traces_and_scripts():
    module = MCHManagedCollisionModule(
        zch_size=5, device=torch.device("cpu"), eviction_policy=LFU_EvictionPolicy(), eviction_interval=1
    )
    module(_jt([1, 2]))
    module.eval()
    scripted = torch.jit.script(torch.fx.symbolic_trace(module))
    assert torch.equal(scripted(_jt([2, 1, 3]))["f"].values(), module(_jt([2, 1, 3]))["f"].values())


def test_constructor_refuses_an_empty_table_and_a_zero_interval():
    with pytest.raises(ValueError, match="zch_size"):
        _module(size=0)
    with pytest.raises(ValueError, match="eviction_interval"):
        _module(interval=0)
