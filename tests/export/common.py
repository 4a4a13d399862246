"""Small model configs, trained-looking weights and request batches shared by the export and runtime tests."""

from __future__ import annotations

import torch
from torch import Tensor

from rectrain.embedding import EmbeddingBagConfig, FusedOptimizerConfig
from rectrain.models import build_model
from rectrain.models.config import ModelConfig
from rectrain.sparse import KeyedJaggedTensor


def dlrm_config(rows: tuple[int, int, int, int] = (300, 200, 120, 80), dim: int = 8) -> ModelConfig:
    """A DLRM over 4 tables: t1 is read by two features, f0 by two tables (t0, t3), t2 pools MEAN."""
    features = [["f0"], ["f1", "g1"], ["f2"], ["f3", "f0"]]
    tables = [
        EmbeddingBagConfig(
            name=f"t{i}",
            num_embeddings=n,
            embedding_dim=dim,
            feature_names=features[i],
            pooling="MEAN" if i == 2 else "SUM",
        )
        for i, n in enumerate(rows)
    ]
    return ModelConfig(
        kind="dlrm",
        tables=tables,
        dense_in_features=5,
        dense_arch_layer_sizes=[16, dim],
        over_arch_layer_sizes=[16, 1],
    )


def trained_state(cfg: ModelConfig, seed: int = 0) -> dict[str, Tensor]:
    """A prediction-module state dict with tables spread like trained ones (not all in a tiny init range)."""
    torch.manual_seed(seed)
    model = build_model(cfg)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    for key, value in state.items():
        if key.endswith(".weight") and "embedding_bags" in key:
            value.normal_(0.0, 0.3)
    return state


def request(
    cfg: ModelConfig, batch: int, seed: int = 1, max_ids: int = 6
) -> tuple[Tensor, KeyedJaggedTensor]:
    """A valid batch for ``cfg`` (keys in reverse order plus an unused key, to exercise routing)."""
    gen = torch.Generator().manual_seed(seed)
    rows: dict[str, int] = {}
    for table in cfg.tables:
        for feature in table.feature_names:
            rows[feature] = min(rows.get(feature, table.num_embeddings), table.num_embeddings)
    keys = [*reversed(rows), "unused"]
    limits = [rows.get(k, 10) for k in keys]
    lengths = torch.randint(0, max_ids + 1, (len(keys), batch), generator=gen)
    values = torch.cat(
        [torch.randint(0, n, (int(lengths[i].sum()),), generator=gen) for i, n in enumerate(limits)]
    )
    kjt = KeyedJaggedTensor.from_lengths_sync(keys=keys, values=values, lengths=lengths.reshape(-1))
    return torch.randn(batch, cfg.dense_in_features, generator=gen), kjt


def fp32_logits(cfg: ModelConfig, state: dict[str, Tensor], dense: Tensor, kjt: KeyedJaggedTensor) -> Tensor:
    # FBGEMM's kernels, as the package's fp32 tables (a collection built TorchRec's way pools with
    # nn.EmbeddingBag, whose sums round differently in the last bit).
    model = build_model(cfg, fused_optimizer=FusedOptimizerConfig())
    model.load_state_dict(state)
    with torch.no_grad():
        return model.eval()(dense, kjt)
