"""EBC, EC and DLRM taking KeyedJaggedTensors pass ``torch.fx.symbolic_trace``, ``torch.export`` and
``torch.compile(fullgraph=True)`` on CPU, as TorchRec's do (checked against TorchRec 1.8.0 on CPU: all
nine pass there too). Under PT2 tracing the collections look up with ``embedding_bag``/``embedding`` over
the same weights (``rectrain.embedding.pt2_lookup``); fx graphs keep the FBGEMM lookup as one node.

Every traced program is run on a second batch with other ids and other bag lengths (same sizes), so a
program that baked in the first batch's data would fail. ``torch.compile`` uses the ``aot_eager`` backend
(fake tensors and AOT autograd, without Inductor's C++ build); one Inductor run is marked slow.
"""

from __future__ import annotations

from functools import partial

import pytest
import torch
import torch._dynamo

import rectrain.fx
from rectrain import (
    EmbeddingBagCollection,
    EmbeddingBagConfig,
    EmbeddingCollection,
    EmbeddingConfig,
    FusedOptimizerConfig,
)
from rectrain.models.dlrm import DLRM
from rectrain.sparse import KeyedJaggedTensor, KeyedTensor

B = 4


def tables() -> list[EmbeddingBagConfig]:
    return [
        EmbeddingBagConfig(name="t1", embedding_dim=8, num_embeddings=20, feature_names=["f1"]),
        EmbeddingBagConfig(
            name="t2", embedding_dim=8, num_embeddings=20, feature_names=["f2", "f3"], pooling="MEAN"
        ),
    ]


def batch(seed: int) -> KeyedJaggedTensor:
    """Three features of B bags, 8 ids in all (the same sizes for every seed, other lengths and ids)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.zeros(3 * B, dtype=torch.int64)
    picks = torch.randint(0, 3 * B, (8,), generator=gen)
    lengths.index_add_(0, picks, torch.ones(8, dtype=torch.int64))
    ids = torch.randint(0, 20, (8,), generator=gen)
    return KeyedJaggedTensor.from_lengths_sync(keys=["f1", "f2", "f3"], values=ids, lengths=lengths)


def ebc(fused: FusedOptimizerConfig | None = None) -> EmbeddingBagCollection:
    torch.manual_seed(0)
    return EmbeddingBagCollection(tables=tables(), fused_optimizer=fused)


def ec(fused: FusedOptimizerConfig | None = None) -> EmbeddingCollection:
    torch.manual_seed(0)
    return EmbeddingCollection(
        tables=[
            EmbeddingConfig(name="t1", embedding_dim=8, num_embeddings=20, feature_names=["f1", "f3"]),
            EmbeddingConfig(name="t2", embedding_dim=4, num_embeddings=20, feature_names=["f2"]),
        ],
        fused_optimizer=fused,
    )


def dlrm(fused: FusedOptimizerConfig | None = None) -> DLRM:
    torch.manual_seed(0)
    return DLRM(
        embedding_bag_collection=EmbeddingBagCollection(tables=tables(), fused_optimizer=fused),
        dense_in_features=3,
        dense_arch_layer_sizes=[8],
        over_arch_layer_sizes=[4, 1],
    )


def inputs(name: str, seed: int) -> tuple:
    kjt = batch(seed)
    return (
        (torch.rand(B, 3, generator=torch.Generator().manual_seed(seed)), kjt)
        if name.endswith("dlrm")
        else (kjt,)
    )


def flat(out) -> torch.Tensor:
    """One tensor holding an output (KeyedTensor, dict of JaggedTensors or a tensor)."""
    if isinstance(out, KeyedTensor):
        return out.values()
    if isinstance(out, dict):
        return torch.cat([torch.cat([jt.values().flatten(), jt.lengths().float()]) for jt in out.values()])
    return out


# Built as TorchRec builds them (tables are parameters) and on the fused FBGEMM path.
MODELS = {
    **{"ebc": ebc, "ec": ec, "dlrm": dlrm},
    **{
        f"fused_{n}": partial(f, FusedOptimizerConfig())
        for n, f in {"ebc": ebc, "ec": ec, "dlrm": dlrm}.items()
    },
}


def check_runs_like_eager(model: torch.nn.Module, traced, name: str) -> None:
    with torch.no_grad():
        for seed in (1, 2):
            args = inputs(name, seed)
            torch.testing.assert_close(flat(traced(*args)), flat(model(*args)))


@pytest.mark.parametrize("name", MODELS)
def test_fx_symbolic_trace(name):
    model = MODELS[name]()
    for trace in (torch.fx.symbolic_trace, rectrain.fx.symbolic_trace):
        check_runs_like_eager(model, trace(model), name)


@pytest.mark.parametrize("name", ["ebc", "ec"])
def test_torch_jit_script_of_a_collection_and_of_its_rectrain_fx_graph(name):
    """TorchScript compiles around the lookups and calls them back in Python (lookup_call)."""
    model = MODELS[name]()
    check_runs_like_eager(model, torch.jit.script(model), name)
    check_runs_like_eager(model, torch.jit.script(rectrain.fx.symbolic_trace(model)), name)


def test_fx_graph_of_ebc_trains_through_the_fused_optimizer():
    """The FBGEMM lookup is one node of the fx graph, so backward through the graph updates the tables."""
    model, reference = ebc(FusedOptimizerConfig()), ebc(FusedOptimizerConfig())
    graph = torch.fx.symbolic_trace(model)
    kjt = batch(3)
    graph(kjt).values().sum().backward()
    reference(kjt).values().sum().backward()
    for table in ("t1", "t2"):
        updated = model.embedding_bags[table].weight
        torch.testing.assert_close(updated, reference.embedding_bags[table].weight)
        assert not torch.equal(updated, ebc(FusedOptimizerConfig()).embedding_bags[table].weight)


@pytest.mark.parametrize("name", MODELS)
def test_torch_export(name):
    model = MODELS[name]()
    program = torch.export.export(model, inputs(name, 0))
    check_runs_like_eager(model, program.module(), name)


@pytest.mark.slow  # 5-10 s each on a 2-core box
@pytest.mark.parametrize("name", MODELS)
def test_torch_compile_fullgraph(name):
    model = MODELS[name]()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    check_runs_like_eager(model, compiled, name)


def test_export_of_a_weighted_ebc_pools_like_fbgemm():
    """Weighted SUM and weighted MEAN (rectrain divides by the bag length) in plain ops match FBGEMM."""
    torch.manual_seed(0)
    model = EmbeddingBagCollection(tables=tables(), is_weighted=True, fused_optimizer=FusedOptimizerConfig())

    def weighted(seed: int) -> KeyedJaggedTensor:
        kjt = batch(seed)
        scores = torch.rand(kjt.values().numel(), generator=torch.Generator().manual_seed(seed))
        return KeyedJaggedTensor.from_lengths_sync(kjt.keys(), kjt.values(), kjt.lengths(), weights=scores)

    program = torch.export.export(model, (weighted(0),))
    with torch.no_grad():
        for seed in (1, 2):
            torch.testing.assert_close(
                program.module()(weighted(seed)).values(), model(weighted(seed)).values()
            )


@pytest.mark.slow
def test_torch_compile_inductor_dlrm():
    model = dlrm()
    torch._dynamo.reset()
    check_runs_like_eager(model, torch.compile(model, fullgraph=True), "dlrm")
