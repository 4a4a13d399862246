import pytest
import torch
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation
from torch import nn

from rectrain.embedding.config import EmbeddingBagConfig, EmbOptimType
from rectrain.embedding.embedding_bag_collection import EmbeddingBagCollection
from rectrain.errors import ConfigError
from rectrain.modules.fused_embedding_modules import FusedEmbeddingBagCollection, fuse_embedding_optimizer
from rectrain.sparse import KeyedJaggedTensor

TABLES = [
    EmbeddingBagConfig(name=f"t{i}", embedding_dim=4, num_embeddings=5, feature_names=[f"f{i}"])
    for i in (0, 1)
]
FEATURES = KeyedJaggedTensor.from_lengths_sync(
    keys=["f0", "f1"], values=torch.tensor([0, 1, 1, 4, 2, 0]), lengths=torch.tensor([2, 1, 0, 1, 2, 0])
)


def test_a_fused_collection_steps_in_backward_as_torchs_optimizer_steps():
    fused = FusedEmbeddingBagCollection(TABLES, torch.optim.Adagrad, {"lr": 0.1}, device=torch.device("cpu"))
    plain = EmbeddingBagCollection(TABLES)
    plain.load_state_dict(fused.state_dict())
    opt = torch.optim.Adagrad(plain.parameters(), lr=0.1)
    for _ in range(2):
        fused(FEATURES).values().sum().backward()
        opt.zero_grad()
        plain(FEATURES).values().sum().backward()
        opt.step()
    for name, weight in plain.state_dict().items():
        torch.testing.assert_close(fused.state_dict()[name], weight)
    assert fused.fused_optimizer() is fused.fused_optimizer
    assert fused.fused_optimizer.optimizer_type is EmbOptimType.ADAGRAD
    assert fused.optimizer_kwargs() == {"lr": 0.1}


def test_fuse_embedding_optimizer_replaces_the_collections_of_a_model():
    model = nn.Sequential(EmbeddingBagCollection(TABLES))
    assert fuse_embedding_optimizer(model, torch.optim.SGD, {"lr": 0.02}, torch.device("cpu")) is model
    assert isinstance(model[0], FusedEmbeddingBagCollection)
    assert model[0].fused_optimizer.param_groups[0]["lr"] == 0.02


def test_uvm_placement_and_optimizers_without_a_kernel_are_refused_by_name():
    with pytest.raises(ConfigError, match="location=.*MANAGED_CACHING.*UVM"):
        FusedEmbeddingBagCollection(
            TABLES, torch.optim.SGD, {"lr": 0.1}, location=EmbeddingLocation.MANAGED_CACHING
        )
    with pytest.raises(ConfigError, match="optimizer_type RMSprop has no fused kernel"):
        FusedEmbeddingBagCollection(TABLES, torch.optim.RMSprop, {"lr": 0.1})
