"""KJTList holds the KeyedJaggedTensors of an input distribution: index, assign, iterate, trace."""

import torch

from rectrain.distributed.embedding_types import KJTList
from rectrain.sparse import KeyedJaggedTensor


def _kjt(value: int) -> KeyedJaggedTensor:
    return KeyedJaggedTensor(keys=["f"], values=torch.tensor([value]), lengths=torch.tensor([1]))


def test_list_operations():
    kjts = KJTList([_kjt(1), _kjt(2)])
    kjts[1] = _kjt(3)
    assert len(kjts) == 2 and [k.values().item() for k in kjts] == [1, 3]


@torch.fx.wrap
def _plus_first_values(x: torch.Tensor, kjts: KJTList) -> torch.Tensor:
    return x + kjts[0].values()


class _Uses(torch.nn.Module):
    def __init__(self, kjts: KJTList) -> None:
        super().__init__()
        self.kjts = kjts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _plus_first_values(x, self.kjts)


def test_a_constant_kjt_list_is_rebuilt_in_a_traced_graph():
    graph = torch.fx.symbolic_trace(_Uses(KJTList([_kjt(5)])))
    assert any(node.target is KJTList for node in graph.graph.nodes)
    assert graph(torch.tensor([1])).tolist() == [6]
