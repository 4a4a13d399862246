"""The sparse types under TorchRec's tracers: ``torch.fx`` (plain and ``rectrain.fx``), TorchScript
(``torch.jit.script``/``trace``) and pytree flattening. Behaviours TorchRec's sparse tests check, in our
words; see ``test_torchrec_parity.py`` for how the yardstick was measured."""

import pytest
import torch
import torch.utils._pytree as pytree
from torch.fx._pytree import tree_flatten_spec

import rectrain.fx
from rectrain.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor, KeyedTensor, kjt_is_equal

torch.fx.wrap("len")

T = torch.tensor


def kjt() -> KeyedJaggedTensor:
    return KeyedJaggedTensor.from_offsets_sync(
        keys=["a", "b"],
        values=T([1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]),
        weights=T([0.5] * 8),
        offsets=T([0, 0, 2, 2, 3, 4, 5, 5, 8], dtype=torch.int32),
    )


class BuildKJT(torch.nn.Module):
    def forward(self, keys: list[str], values: torch.Tensor, weights: torch.Tensor, lengths: torch.Tensor):
        out = KeyedJaggedTensor(keys, values, weights, lengths)
        return out, out.stride()


class ReadKJT(torch.nn.Module):
    def forward(self, features: KeyedJaggedTensor) -> int:
        return len(features.keys()) + features.values().numel() + features.lengths().numel()


class ConstantKJT(torch.nn.Module):
    def forward(self, x: int) -> int:
        features = kjt()
        return len(features.keys()) + features.values().numel() + features.offsets().numel()


def test_fx_records_construction_from_traced_values_as_a_node():
    graph = rectrain.fx.symbolic_trace(BuildKJT())
    assert "KeyedJaggedTensor" in graph.code and "return (keyed_jagged_tensor," in graph.code
    args = (["a", "b"], T([1.0, 2.0, 3.0]), T([1.0, 1.0, 1.0]), T([2, 0, 1, 0]))
    out, stride = graph(*args)
    assert stride == 2 and out["a"].values().tolist() == [1.0, 2.0]
    torch.jit.script(graph)


def test_fx_folds_a_kjt_built_from_constants():
    graph = rectrain.fx.symbolic_trace(ConstantKJT())
    assert "return 19" in graph.code and "KeyedJaggedTensor" not in graph.code
    assert graph(0) == ConstantKJT()(0) == 19
    torch.jit.script(graph)


def test_fx_and_script_with_a_kjt_input():
    graph = rectrain.fx.symbolic_trace(ReadKJT())
    assert "keys()" in graph.code and "values()" in graph.code
    assert graph(kjt()) == ReadKJT()(kjt()) == 2 + 8 + 8
    assert torch.jit.script(graph)(kjt()) == 18


def test_fx_traces_jagged_tensor_helpers_and_concat():
    traced = torch.fx.symbolic_trace(JaggedTensor.from_dense_lengths)
    jt = traced(values=T([[1.0, 2.0], [3.0, 4.0]]), lengths=T([1, 2]))
    assert jt.values().tolist() == [1.0, 3.0, 4.0]

    class Concat(torch.nn.Module):
        def forward(self, parts: list[KeyedJaggedTensor]) -> KeyedJaggedTensor:
            return KeyedJaggedTensor.concat(parts)

    parts = kjt().split([1, 1])
    assert kjt_is_equal(torch.fx.symbolic_trace(Concat())(parts), Concat()(parts))


def test_torchscript_compiles_the_types_and_their_methods():
    class Use(torch.nn.Module):
        def forward(self, features: KeyedJaggedTensor) -> list[KeyedJaggedTensor]:
            features.dist_labels()
            features.dist_splits([1, 1])
            rebuilt = KeyedJaggedTensor.dist_init(
                keys=features.keys(),
                tensors=features.dist_tensors(),
                variable_stride_per_key=False,
                num_workers=1,
                recat=None,
                stride_per_rank=[features.stride()],
            )
            return rebuilt.permute([1, 0]).split([1, 1])

    scripted = torch.jit.script(Use())
    first, second = scripted(kjt())
    assert first.keys() == ["b"] and second.values().tolist() == [1.0, 2.0, 3.0]
    assert torch.jit.script(KeyedJaggedTensor.empty)().to_dict() == {}
    assert torch.jit.script(JaggedTensor.empty)().to_dense() == []

    def index(kt: KeyedTensor) -> torch.Tensor:
        return kt["x"]

    assert torch.jit.script(index)(KeyedTensor(["x"], [2], torch.ones(1, 2))).tolist() == [[1.0, 1.0]]


def test_jit_trace_reruns_the_constructor_for_other_batch_sizes():
    class FirstKeyOffsets(torch.nn.Module):
        def forward(self, offsets: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
            return KeyedJaggedTensor.from_offsets_sync(keys=["a", "b"], values=values, offsets=offsets)[
                "a"
            ].offsets()

    traced = torch.jit.trace(FirstKeyOffsets(), (T([0, 2, 2]), torch.arange(2)), strict=False)
    assert traced(T([0, 2, 2, 3, 4, 6, 8]), torch.arange(8)).tolist() == [0, 2, 2, 3]


def test_pytree_layouts():
    vbe = KeyedJaggedTensor(
        keys=["a", "b"],
        values=torch.arange(8.0),
        offsets=T([0, 2, 2, 3, 4, 5, 8]),
        stride_per_key_per_rank=[[2], [4]],
        inverse_indices=(["a", "b"], T([[0, 1, 0], [0, 0, 0]])),
    )
    leaves, spec = pytree.tree_flatten(vbe)
    assert len(leaves) == 6  # values, weights, lengths, offsets, stride_per_key_per_rank, inverse indices
    rebuilt = pytree.tree_unflatten(leaves, spec)
    assert rebuilt.stride_per_key_per_rank() == [[2], [4]] and rebuilt.inverse_indices()[1].shape == (2, 3)
    short = pytree.TreeSpec(type=spec.type, context=spec.context, children_specs=spec.children_specs[:4])
    assert pytree.tree_unflatten(leaves[:4], short).inverse_indices_or_none() is None
    with pytest.raises(ValueError, match="at most 6 leaves"):
        pytree.tree_unflatten(
            leaves + leaves, pytree.TreeSpec(spec.type, spec.context, spec.children_specs * 2)
        )


def test_keyed_tensor_spec_flattening_follows_the_spec_key_order():
    kt = KeyedTensor.from_tensor_list(["x", "y"], [T([[1.0], [2.0]]), T([[3.0, 4.0], [5.0, 6.0]])])
    _, spec = pytree.tree_flatten(kt)
    swapped = KeyedTensor.from_tensor_list(["y", "x"], [T([[3.0, 4.0], [5.0, 6.0]]), T([[1.0], [2.0]])])
    rebuilt = pytree.tree_unflatten(tree_flatten_spec(swapped, spec), spec)
    assert rebuilt.keys() == ["x", "y"] and torch.equal(rebuilt["y"], kt["y"])


def test_torch_export_with_a_kjt_input_runs_on_other_data():
    class SumPerKey(torch.nn.Module):
        def forward(self, features: KeyedJaggedTensor) -> torch.Tensor:
            return torch.stack([jt.values().sum() for jt in features.to_dict().values()])

    program = torch.export.export(SumPerKey(), (kjt(),))
    other = KeyedJaggedTensor(  # the same sizes, other lengths and values
        keys=["a", "b"],
        values=torch.arange(8.0),
        weights=torch.ones(8),
        offsets=T([0, 1, 1, 1, 2, 2, 6, 7, 8], dtype=torch.int32),
    )
    assert program.module()(other).tolist() == [0.0 + 1.0, 2.0 + 3.0 + 4.0 + 5.0 + 6.0 + 7.0]
