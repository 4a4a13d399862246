"""CrossNet / LowRankCrossNet against a direct per-example computation; DLRM_DCN shapes and learning."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from rectrain import EmbeddingBagCollection, FusedOptimizerConfig
from rectrain.errors import ConfigError
from rectrain.models import DLRM_DCN, CrossNet, DLRMTrain, InteractionDCNArch, LowRankCrossNet
from tests.models.test_dlrm import DENSE, B, D, F, _learnable_batch, kjt, tables


def _direct_cross(x0, weights, biases):
    """x_{l+1} = x0 * (W_l x_l + b_l) + x_l, one example (column vector) at a time."""
    rows = []
    for example in x0:
        x_l = example
        for w, b in zip(weights, biases):
            x_l = example * (w @ x_l + b) + x_l
        rows.append(x_l)
    return torch.stack(rows)


@given(n=st.integers(1, 12), layers=st.integers(1, 3), batch=st.integers(1, 5), seed=st.integers(0, 99))
def test_crossnet_matches_direct_computation(n, layers, batch, seed):
    torch.manual_seed(seed)
    net = CrossNet(n, layers)
    with torch.no_grad():
        for b in net.bias:
            b.normal_()  # zero at init; make the bias term count
    x = torch.randn(batch, n, dtype=torch.float32)
    expected = _direct_cross(x, list(net.kernels), [b.squeeze(1) for b in net.bias])
    torch.testing.assert_close(net(x), expected, rtol=1e-4, atol=1e-4)


@given(n=st.integers(1, 12), rank=st.integers(1, 4), layers=st.integers(1, 3), seed=st.integers(0, 99))
def test_low_rank_crossnet_is_crossnet_with_w_equal_u_v(n, rank, layers, seed):
    torch.manual_seed(seed)
    low = LowRankCrossNet(n, layers, rank)
    with torch.no_grad():
        for b in low.bias:
            b.normal_()
    x = torch.randn(4, n)
    weights = [u @ v for u, v in zip(low.W_kernels, low.V_kernels)]
    torch.testing.assert_close(low(x), _direct_cross(x, weights, list(low.bias)), rtol=1e-4, atol=1e-4)


def test_parameter_names_and_shapes_follow_torchrec():
    shapes = {k: tuple(v.shape) for k, v in LowRankCrossNet(10, 2, 3).state_dict().items()}
    assert shapes == {
        "W_kernels.0": (10, 3),
        "W_kernels.1": (10, 3),
        "V_kernels.0": (3, 10),
        "V_kernels.1": (3, 10),
        "bias.0": (10,),
        "bias.1": (10,),
    }
    assert {k: tuple(v.shape) for k, v in CrossNet(5, 1).state_dict().items()} == {
        "kernels.0": (5, 5),
        "bias.0": (5, 1),
    }


@pytest.mark.parametrize(
    "build, pattern",
    [
        (lambda: CrossNet(0, 2), "in_features must be a positive int, got 0"),
        (lambda: LowRankCrossNet(8, 0, 2), "num_layers must be a positive int, got 0"),
        (lambda: LowRankCrossNet(8, 2, 0), "low_rank must be a positive int, got 0"),
    ],
)
def test_bad_sizes_raise_config_errors(build, pattern):
    with pytest.raises(ConfigError, match=pattern):
        build()


def _dcn(rows=50, low_rank=4):
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(
        tables(rows=rows), fused_optimizer=FusedOptimizerConfig(optimizer="rowwise_adagrad", lr=0.1)
    )
    return DLRM_DCN(ebc, DENSE, [8, D], [16, 1], dcn_num_layers=2, dcn_low_rank_dim=low_rank)


def test_dlrm_dcn_shapes_and_composition():
    m = _dcn()
    dense, features = torch.randn(B, DENSE), kjt()
    assert m(dense, features).shape == (B, 1)
    embedded_dense, embedded_sparse = m.dense_arch(dense), m.sparse_arch(features)
    flat = torch.cat([embedded_dense.unsqueeze(1), embedded_sparse], dim=1).reshape(B, (F + 1) * D)
    inter = m.inter_arch(embedded_dense, embedded_sparse)
    assert isinstance(m.inter_arch, InteractionDCNArch) and inter.shape == (B, (F + 1) * D)
    torch.testing.assert_close(inter, m.inter_arch.crossnet(flat))
    torch.testing.assert_close(m(dense, features), m.over_arch(inter))
    keys = set(m.state_dict())
    assert {
        "inter_arch.crossnet.W_kernels.0",
        "inter_arch.crossnet.V_kernels.1",
        "over_arch.model.1.weight",
    } <= keys
    assert "sparse_arch.embedding_bag_collection.embedding_bags.t0.weight" in keys


def test_dlrm_dcn_training_steps_reduce_the_loss():
    train = DLRMTrain(_dcn(rows=20))
    opt = torch.optim.Adagrad([p for n, p in train.named_parameters() if "sparse_arch" not in n], lr=0.05)
    losses = []
    for step in range(40):
        loss, (_, logits, labels) = train(_learnable_batch(step % 4, batch=128))
        assert logits.shape == labels.shape == (128,)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.6 * sum(losses[:5]) / 5, losses
