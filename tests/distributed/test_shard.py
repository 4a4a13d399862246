"""``rectrain.distributed.shard`` (TorchRec's ``shard`` / ``shard_modules``) on real gloo ranks: the sharded
collection looks up what the unsharded one does, sharders' ``shard`` and ``bounds_check_mode`` are honoured,
and ``shard_modules`` shards planned collections in place without wrapping the rest."""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from rectrain import EmbeddingBagCollection, EmbeddingBagConfig, KeyedJaggedTensor
from rectrain.distributed.embeddingbag import EmbeddingBagCollectionSharder
from rectrain.distributed.shard import shard, shard_modules
from rectrain.distributed.sharded.embedding_bag import ShardedEmbeddingBagCollection
from rectrain.distributed.sharding_plan import row_wise, table_wise
from rectrain.distributed.types import BoundsCheckMode
from rectrain.errors import ConfigError
from tests.distributed.multiprocess import run_multiprocess

ROWS = 10


@pytest.fixture(autouse=True)
def _fbgemm_backward(monkeypatch):
    # Skip compiling the native CPU backward in every spawned rank: these tests look up, never train.
    monkeypatch.setenv("RECTRAIN_CPU_BACKWARD", "fbgemm")


def _ebc(device: str = "cpu") -> EmbeddingBagCollection:
    tables = [
        EmbeddingBagConfig(name=f"t{i}", embedding_dim=8, num_embeddings=ROWS, feature_names=[f"f{i}"])
        for i in range(2)
    ]
    torch.manual_seed(0)
    return EmbeddingBagCollection(tables=tables, device=torch.device(device))


def _batch(bad: bool = False) -> KeyedJaggedTensor:
    values = torch.tensor([1, 2, 3, 9, ROWS + 5 if bad else 4, 0])
    return KeyedJaggedTensor.from_lengths_sync(["f0", "f1"], values, torch.tensor([2, 1, 1, 2]))


def _shard_forms(env) -> list:
    reference = _ebc()
    expected = reference(_batch()).values()
    plans = {
        "per table": {"t0": table_wise(rank=0), "t1": table_wise(rank=env.world_size - 1)},
        "one generator": row_wise(),
    }
    results = []
    for form, plan in plans.items():
        sharded = shard(_ebc(), plan, env=env, device=torch.device("cpu"))
        assert isinstance(sharded, ShardedEmbeddingBagCollection), form
        results.append((sharded(_batch()).values() - expected).abs().max().item())
    # A sharder's own shard(), as TorchRec's tests call it, with a materialised module plan.
    sharder = EmbeddingBagCollectionSharder()
    module_plan = {
        name: gen(cfg, env.world_size, env.world_size)
        for cfg in _ebc().embedding_bag_configs()
        for name, gen in [(cfg.name, row_wise())]
    }
    sharded = sharder.shard(_ebc(), module_plan, env, torch.device("cpu"))
    results.append((sharded(_batch()).values() - expected).abs().max().item())
    return results


def test_shard_plan_forms_match_the_unsharded_collection():
    for rank_result in run_multiprocess(_shard_forms, 2):
        assert rank_result == [0.0, 0.0, 0.0]


class _Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.sparse = _ebc("meta")
        self.dense = nn.Linear(16, 1)

    def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
        return self.dense(self.sparse(kjt).values())


def _shard_modules(env) -> list:
    model = _Model()
    sharded = shard_modules(model, env=env, device=torch.device("cpu"), init_params=True)
    out = sharded(_batch())
    return [
        sharded is model,
        isinstance(model.sparse, ShardedEmbeddingBagCollection),
        type(model.dense) is nn.Linear,
        not any(p.is_meta for p in model.parameters()),
        list(out.shape),
    ]


def test_shard_modules_shards_collections_in_place_and_leaves_the_rest():
    for rank_result in run_multiprocess(_shard_modules, 2):
        assert rank_result == [True, True, True, True, [2, 1]]


def _bounds(env) -> dict:
    results = {}
    for mode in ("FATAL", "WARNING", "IGNORE"):
        sharder = EmbeddingBagCollectionSharder(fused_params={"bounds_check_mode": BoundsCheckMode[mode]})
        plan = {"t0": table_wise(rank=0), "t1": table_wise(rank=0)}
        sharded = shard(_ebc(), plan, env=env, sharder=sharder)
        try:
            bad = sharded(_batch(bad=True)).values()
        except ValueError as e:
            results[mode] = str(e)
            continue
        # The bad id of f1 was looked up as row 0: as the good batch with that id replaced by 0.
        values = torch.tensor([1, 2, 3, 9, 0, 0])
        zeroed = KeyedJaggedTensor.from_lengths_sync(["f0", "f1"], values, torch.tensor([2, 1, 1, 2]))
        results[mode] = (bad - sharded(zeroed).values()).abs().max().item()
    return results


def test_sharder_bounds_check_mode_is_honoured():
    (result,) = run_multiprocess(_bounds, 1)
    assert "feature 'f1': id 15 is out of range" in result["FATAL"]
    assert result["WARNING"] == 0.0 and result["IGNORE"] == 0.0


def test_uvm_caching_and_unknown_bounds_modes_are_refused_by_name():
    with pytest.raises(ConfigError, match="cache_load_factor=0.2 asks for UVM caching"):
        EmbeddingBagCollectionSharder(fused_params={"cache_load_factor": 0.2})
    with pytest.raises(ConfigError, match="bounds_check_mode='LOUD' is not one of"):
        EmbeddingBagCollectionSharder(fused_params={"bounds_check_mode": "LOUD"})


def test_a_sharder_for_another_module_type_is_refused():
    from rectrain.distributed.embedding import EmbeddingCollectionSharder

    with pytest.raises(ConfigError, match="EmbeddingCollectionSharder shards EmbeddingCollection, not Emb"):
        shard(_ebc(), row_wise(), sharder=EmbeddingCollectionSharder())


def test_warning_mode_logs_the_bad_id(caplog):
    from rectrain.distributed.routing.id_check import IdCheck

    check = IdCheck(["f0", "f1"], [10, 10], mode=BoundsCheckMode.WARNING)
    with caplog.at_level(logging.WARNING):
        fixed = check(torch.tensor([[2, 0], [1, 1]]), torch.tensor([1, 2, 12, 3]))
    assert fixed.tolist() == [1, 2, 0, 3]
    assert "feature 'f1': id 12 is out of range" in caplog.text


@pytest.mark.parametrize(("mode", "expected"), [("IGNORE", [1, 0, 0, 3]), ("NONE", [1, -1, 12, 3])])
def test_ignore_zeroes_silently_and_none_checks_nothing(mode, expected, caplog):
    from rectrain.distributed.routing.id_check import IdCheck

    check = IdCheck(["f0", "f1"], [10, 10], mode=BoundsCheckMode[mode])
    with caplog.at_level(logging.WARNING):
        assert check(torch.tensor([[2, 0], [1, 1]]), torch.tensor([1, -1, 12, 3])).tolist() == expected
    assert not caplog.text
