"""DLRM: shapes, the interaction math, TorchRec's state-dict layout, argument errors, and learning."""

import pytest
import torch

from rectrain import EmbeddingBagCollection, EmbeddingBagConfig, FusedOptimizerConfig, KeyedJaggedTensor
from rectrain.errors import ConfigError
from rectrain.models import DLRM, Batch, DLRMTrain, InteractionArch

B, DENSE, D, F, E = 6, 5, 4, 3, 50


def tables(dims=(D,) * F, rows=E):
    return [
        EmbeddingBagConfig(name=f"t{i}", num_embeddings=rows, embedding_dim=d, feature_names=[f"f{i}"])
        for i, d in enumerate(dims)
    ]


def kjt(batch=B, num_features=F, rows=E, seed=0, keys=None):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, 4, (num_features * batch,), generator=g)
    values = torch.randint(0, rows, (int(lengths.sum()),), generator=g)
    keys = keys or [f"f{i}" for i in range(num_features)]
    return KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths)


def model(**kwargs):
    torch.manual_seed(0)
    args = dict(dense_in_features=DENSE, dense_arch_layer_sizes=[8, D], over_arch_layer_sizes=[7, 1])
    args.update(kwargs)
    return DLRM(EmbeddingBagCollection(tables()), **args)


def test_forward_shapes_and_submodules():
    m = model()
    dense = torch.randn(B, DENSE)
    assert m(dense, kjt()).shape == (B, 1)
    assert m.sparse_arch(kjt()).shape == (B, F, D)
    assert m.dense_arch(dense).shape == (B, D)
    assert m.inter_arch(torch.randn(B, D), torch.randn(B, F, D)).shape == (B, D + F * (F + 1) // 2)
    assert m.over_arch.model[1].in_features == 7
    assert m.over_arch.model[0]._mlp[0]._linear.in_features == D + F * (F + 1) // 2


def test_state_dict_keys_follow_torchrec():
    keys = list(model().state_dict())
    assert "dense_arch.model._mlp.0._linear.weight" in keys
    assert "over_arch.model.0._mlp.0._linear.bias" in keys
    assert "over_arch.model.1.weight" in keys
    assert "sparse_arch.embedding_bag_collection.embedding_bags.t0.weight" in keys


def test_interaction_matches_direct_pairwise_dots():
    torch.manual_seed(1)
    dense, sparse = torch.randn(B, D), torch.randn(B, F, D)
    out = InteractionArch(F)(dense, sparse)
    rows = [dense] + [sparse[:, i] for i in range(F)]
    expected = [(rows[i] * rows[j]).sum(1) for i in range(F + 1) for j in range(i + 1, F + 1)]
    torch.testing.assert_close(out[:, :D], dense)
    torch.testing.assert_close(out[:, D:], torch.stack(expected, dim=1))


def test_interaction_gradients_match_autograd_of_the_direct_pairwise_dots():
    """Training runs its own backward ((G + G^T) Z); it must give the gradient of the same formula."""
    torch.manual_seed(2)
    leaves = [torch.randn(B, D, requires_grad=True), torch.randn(B, F, D, requires_grad=True)]
    copies = [x.detach().clone().requires_grad_(True) for x in leaves]
    out = InteractionArch(F)(*leaves)
    weight = torch.randn(out.shape)
    (out * weight).sum().backward()
    dense, sparse = copies
    rows = [dense] + [sparse[:, i] for i in range(F)]
    pairs = [(rows[i] * rows[j]).sum(1) for i in range(F + 1) for j in range(i + 1, F + 1)]
    expected = torch.cat([dense, torch.stack(pairs, dim=1)], dim=1)
    torch.testing.assert_close(out, expected)
    (expected * weight).sum().backward()
    for mine, theirs in zip(leaves, copies):
        torch.testing.assert_close(mine.grad, theirs.grad)


def test_interaction_records_plain_ops_for_tracers_and_scripting():
    arch, dense, sparse = InteractionArch(F), torch.randn(B, D, requires_grad=True), torch.randn(B, F, D)
    expected = arch(dense, sparse)
    traced = torch.jit.trace(arch, (dense, sparse), check_trace=False)
    assert "PythonOp" not in str(traced.graph)  # a Python autograd function would not serialize
    for converted in (traced, torch.jit.script(arch), torch.fx.symbolic_trace(arch)):
        torch.testing.assert_close(converted(dense, sparse), expected)


def test_sparse_arch_stacks_pooled_embeddings_in_table_order():
    m = model()
    features = kjt()
    pooled = m.sparse_arch.embedding_bag_collection(features)
    out = m.sparse_arch(features)
    for i in range(F):
        torch.testing.assert_close(out[:, i], pooled[f"f{i}"])


def test_dlrm_forward_equals_manual_composition():
    m = model()
    dense, features = torch.randn(B, DENSE), kjt()
    manual = m.over_arch(m.inter_arch(m.dense_arch(dense), m.sparse_arch(features)))
    torch.testing.assert_close(m(dense, features), manual)
    assert (m.dense_arch(dense) >= 0).all()  # ReLU after the last bottom layer, as in TorchRec


def test_dense_arch_output_must_match_embedding_dim():
    with pytest.raises(
        ValueError, match=r"dense_arch_layer_sizes\[-1\] \(8\) must equal .*embedding_dim \(4\)"
    ):
        model(dense_arch_layer_sizes=[16, 8])


def test_tables_with_different_dims_are_rejected():
    with pytest.raises(ConfigError, match="same embedding_dim"):
        DLRM(EmbeddingBagCollection(tables(dims=(4, 8, 4))), DENSE, [8, 4], [4, 1])


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(dense_arch_layer_sizes=[]), r"dense_arch_layer_sizes must list at least one"),
        (dict(over_arch_layer_sizes=[]), r"over_arch_layer_sizes must list at least one"),
        (dict(over_arch_layer_sizes=[8, 0]), r"over_arch_layer_sizes\[1\] must be a positive int, got 0"),
        (dict(dense_in_features=0), r"dense_in_features\[0\] must be a positive int"),
    ],
)
def test_bad_layer_sizes_name_the_argument(kwargs, pattern):
    with pytest.raises(ConfigError, match=pattern):
        model(**kwargs)


def test_single_over_arch_layer_is_one_linear():
    m = model(over_arch_layer_sizes=[1])
    assert m(torch.randn(B, DENSE), kjt()).shape == (B, 1)


def test_kjt_keys_in_another_order_give_the_same_logits():
    m = model()
    dense, features = torch.randn(B, DENSE), kjt()
    permuted = features.permute([2, 0, 1])
    torch.testing.assert_close(m(dense, permuted), m(dense, features))


def test_batch_to_keeps_contents():
    batch = Batch(torch.randn(B, DENSE), kjt(), torch.ones(B))
    moved = batch.to("cpu")
    torch.testing.assert_close(moved.dense_features, batch.dense_features)
    assert torch.equal(moved.sparse_features.values(), batch.sparse_features.values())


def _learnable_batch(seed, batch=256, rows=20):
    """Label = 1 iff feature f0's single id is even; dense features are noise."""
    g = torch.Generator().manual_seed(seed)
    lengths = torch.ones(F * batch, dtype=torch.long)
    values = torch.randint(0, rows, (F * batch,), generator=g)
    labels = (values[:batch] % 2 == 0).float()
    features = KeyedJaggedTensor.from_lengths_sync(
        keys=[f"f{i}" for i in range(F)], values=values, lengths=lengths
    )
    return Batch(torch.randn(batch, DENSE, generator=g), features, labels)


def test_training_steps_reduce_the_loss():
    torch.manual_seed(0)
    ebc = EmbeddingBagCollection(
        tables(rows=20), fused_optimizer=FusedOptimizerConfig(optimizer="rowwise_adagrad", lr=0.1)
    )
    train = DLRMTrain(DLRM(ebc, DENSE, [16, D], [16, 1]))
    dense_params = [p for n, p in train.named_parameters() if "sparse_arch" not in n]
    opt = torch.optim.Adagrad(dense_params, lr=0.05)
    losses = []
    for step in range(60):
        loss, (detached, logits, labels) = train(_learnable_batch(step % 4))
        assert logits.shape == labels.shape == (256,) and not detached.requires_grad
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert sum(losses[-5:]) / 5 < 0.5 * sum(losses[:5]) / 5
    held_out = _learnable_batch(99)
    _, (_, logits, labels) = train(held_out)
    assert ((logits > 0).float() == labels).float().mean() > 0.9
