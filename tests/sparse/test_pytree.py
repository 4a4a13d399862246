"""The sparse types are pytree nodes: flatten/unflatten round-trips and tree_map sees their tensors."""

import torch
import torch.utils._pytree as pytree

from rectrain.sparse import JaggedTensor, KeyedJaggedTensor, KeyedTensor, jt_is_equal, kjt_is_equal


def test_jagged_tensor_round_trip():
    jt = JaggedTensor(values=torch.arange(3.0), lengths=torch.tensor([1, 2]), weights=torch.ones(3))
    leaves, spec = pytree.tree_flatten(jt)
    assert any(leaf is jt.values() for leaf in leaves)
    assert jt_is_equal(pytree.tree_unflatten(leaves, spec), jt)


def test_kjt_round_trip_keeps_vbe_and_inverse_indices():
    kjt = KeyedJaggedTensor(
        keys=["a", "b"],
        values=torch.arange(4),
        lengths=torch.tensor([1, 2, 1]),
        stride_per_key_per_rank=[[2], [1]],
        inverse_indices=(["a", "b"], torch.tensor([[0, 1], [0, 0]])),
    )
    leaves, spec = pytree.tree_flatten(kjt)
    rebuilt = pytree.tree_unflatten(leaves, spec)
    assert kjt_is_equal(rebuilt, kjt)
    assert rebuilt.stride_per_key_per_rank() == [[2], [1]]
    assert rebuilt.inverse_indices()[1].tolist() == [[0, 1], [0, 0]]


def test_tree_map_reaches_the_tensors():
    kjt = KeyedJaggedTensor(keys=["a"], values=torch.arange(3), lengths=torch.tensor([1, 2]))
    doubled = pytree.tree_map(lambda t: t * 2 if t is kjt.values() else t, kjt)
    assert doubled.values().tolist() == [0, 2, 4] and doubled.keys() == ["a"]


def test_keyed_tensor_round_trip_and_paths():
    kt = KeyedTensor(["a", "b"], [1, 2], torch.randn(2, 3), key_dim=1)
    leaves, spec = pytree.tree_flatten(kt)
    rebuilt = pytree.tree_unflatten(leaves, spec)
    assert rebuilt.keys() == ["a", "b"] and rebuilt.length_per_key() == [1, 2]
    assert torch.equal(rebuilt.values(), kt.values())
    paths = [pytree.keystr(path) for path, _ in pytree.tree_flatten_with_path(kt)[0]]
    assert paths == [".values"]


def test_nested_containers():
    jt = JaggedTensor(values=torch.arange(2), lengths=torch.tensor([2]))
    tree = {"sparse": [jt], "dense": torch.ones(1)}
    leaves, spec = pytree.tree_flatten(tree)
    rebuilt = pytree.tree_unflatten(leaves, spec)
    assert jt_is_equal(rebuilt["sparse"][0], jt) and torch.equal(rebuilt["dense"], torch.ones(1))


def test_torch_export_accepts_a_kjt_input():
    class SumIds(torch.nn.Module):
        def forward(self, kjt: KeyedJaggedTensor) -> torch.Tensor:
            return kjt.values().float().sum() + kjt.lengths().sum()

    kjt = KeyedJaggedTensor(keys=["a", "b"], values=torch.arange(4), lengths=torch.tensor([1, 2, 1, 0]))
    exported = torch.export.export(SumIds(), (kjt,))
    ones = torch.ones(4, dtype=torch.int64)
    same_shapes = KeyedJaggedTensor(keys=["a", "b"], values=ones, lengths=kjt.lengths())
    assert exported.module()(same_shapes).item() == 8.0
