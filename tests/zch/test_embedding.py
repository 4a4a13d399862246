"""Managed-collision embedding collections: remap, look up, train; traced and scripted for serving."""

import pytest
import torch

from rectrain.embedding import EmbeddingBagCollection, EmbeddingCollection
from rectrain.embedding.config import EmbeddingBagConfig, EmbeddingConfig
from rectrain.fx import symbolic_trace
from rectrain.sparse import KeyedJaggedTensor, KeyedTensor
from rectrain.zch.collection import ManagedCollisionCollection
from rectrain.zch.embedding import ManagedCollisionEmbeddingBagCollection, ManagedCollisionEmbeddingCollection
from rectrain.zch.eviction import DistanceLFU_EvictionPolicy
from rectrain.zch.mch import MCHManagedCollisionModule


def _mch(size):
    return MCHManagedCollisionModule(
        zch_size=size,
        device=torch.device("cpu"),
        eviction_policy=DistanceLFU_EvictionPolicy(),
        eviction_interval=1,
    )


def _mc_ebc(return_remapped=True):
    tables = [EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4, feature_names=["f"])]
    ebc = EmbeddingBagCollection(tables=tables)
    mcc = ManagedCollisionCollection({"t": _mch(10)}, tables)
    return ManagedCollisionEmbeddingBagCollection(ebc, mcc, return_remapped_features=return_remapped)


def _kjt(ids):
    return KeyedJaggedTensor.from_lengths_sync(
        keys=["f"], values=torch.tensor(ids), lengths=torch.ones(len(ids), dtype=torch.int64)
    )


def test_unbounded_ids_are_looked_up_at_their_rows():
    mc_ebc = _mc_ebc()
    pooled, remapped = mc_ebc(_kjt([10**12, 7, 10**15]))
    assert isinstance(pooled, KeyedTensor)
    weight = mc_ebc._embedding_bag_collection.embedding_bags["t"].weight
    torch.testing.assert_close(pooled["f"], weight[remapped.values()])


def test_training_steps_the_rows_of_the_remapped_ids():
    mc_ebc = _mc_ebc()
    optimizer = torch.optim.SGD(mc_ebc.parameters(), lr=0.5)
    weight = mc_ebc._embedding_bag_collection.embedding_bags["t"].weight
    before = weight.detach().clone()
    pooled, remapped = mc_ebc(_kjt([123456789, 987654321]))
    pooled.values().sum().backward()
    optimizer.step()
    changed = (weight.detach() != before).any(dim=1).nonzero().flatten().tolist()
    assert changed == sorted(remapped.values().tolist())


def test_collections_must_share_their_configs():
    tables = [EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=4, feature_names=["f"])]
    other = [EmbeddingBagConfig(name="t", num_embeddings=10, embedding_dim=8, feature_names=["f"])]
    with pytest.raises(ValueError, match="same table configs"):
        ManagedCollisionEmbeddingBagCollection(
            EmbeddingBagCollection(tables=tables), ManagedCollisionCollection({"t": _mch(10)}, other)
        )


def test_sequence_collection_returns_per_id_embeddings():
    tables = [EmbeddingConfig(name="t", num_embeddings=10, embedding_dim=4, feature_names=["f"])]
    mc_ec = ManagedCollisionEmbeddingCollection(
        EmbeddingCollection(tables=tables), ManagedCollisionCollection({"t": _mch(10)}, tables)
    )
    out, remapped = mc_ec(_kjt([5, 6, 5]))
    assert remapped is None and out["f"].values().shape == (3, 4)
    torch.testing.assert_close(out["f"].values()[0], out["f"].values()[2])


def test_eval_model_traces_and_its_remapper_scripts_like_the_eager_one():
    mc_ebc = _mc_ebc(return_remapped=False)
    mc_ebc(_kjt([1, 2, 3]))
    mc_ebc.eval()
    probe = _kjt([3, 2, 99])
    eager, _ = mc_ebc(probe)
    traced, none = symbolic_trace(mc_ebc)(probe)
    assert none is None
    torch.testing.assert_close(traced.values(), eager.values())
    mcc = mc_ebc._managed_collision_collection
    scripted = torch.jit.script(symbolic_trace(mcc))
    assert torch.equal(scripted(probe).values(), mcc(probe).values())


def test_state_dict_checkpoints_tables_and_remappers_together():
    trained, fresh = _mc_ebc(), _mc_ebc()
    for ids in ([1, 2], [3, 1], [4, 4]):
        trained(_kjt(ids))
    fresh.load_state_dict(trained.state_dict())
    trained.eval(), fresh.eval()
    probe = _kjt([1, 2, 3, 4, 5])
    torch.testing.assert_close(fresh(probe)[0].values(), trained(probe)[0].values())
    assert torch.equal(fresh(probe)[1].values(), trained(probe)[1].values())


def test_torch_distributed_checkpoint_saves_and_restores_the_remappers(tmp_path):
    import torch.distributed.checkpoint as dcp

    trained, fresh = _mc_ebc(), _mc_ebc()
    for ids in ([10, 20], [30, 10], [40, 40]):
        trained(_kjt(ids))
    dcp.save(trained.state_dict(), checkpoint_id=str(tmp_path))
    state = fresh.state_dict()
    dcp.load(state, checkpoint_id=str(tmp_path))
    fresh.load_state_dict(state)
    trained.eval(), fresh.eval()
    probe = _kjt([10, 20, 30, 40, 50])
    assert torch.equal(fresh(probe)[1].values(), trained(probe)[1].values())
    torch.testing.assert_close(fresh(probe)[0].values(), trained(probe)[0].values())
