"""A few training steps of a small embedding model on synthetic, learnable data: ``rectrain demo``.

The labels come from a hidden per-id score, so a model that learns its embeddings drives the loss down; the
summary shows that the whole stack (KeyedJaggedTensor -> FBGEMM lookups -> fused optimizer + dense optimizer)
is learning, not just running.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from torch import nn

from rectrain.distributed import DistributedModelParallel, ShardingEnv
from rectrain.embedding import EmbeddingBagCollection
from rectrain.embedding.config import EmbeddingBagConfig, FusedOptimizerConfig
from rectrain.optim import CombinedOptimizer
from rectrain.sparse import KeyedJaggedTensor


@dataclass
class DemoConfig:
    num_tables: int = 4
    num_embeddings: int = 10_000
    embedding_dim: int = 16
    dense_features: int = 8
    batch_size: int = 512
    steps: int = 200
    max_ids_per_feature: int = 8
    lr: float = 0.05
    seed: int = 0


@dataclass
class DemoSummary:
    tables: list[str]
    steps: int
    examples: int
    seconds: float
    first_loss: float
    last_loss: float
    accuracy: float
    losses: list[float] = field(default_factory=list)
    plan_report: str = ""


class DemoModel(nn.Module):
    """Pooled embeddings of every feature, concatenated with the dense features, then an MLP to one logit."""

    def __init__(self, tables: list[EmbeddingBagConfig], dense_features: int, lr: float) -> None:
        super().__init__()
        self.ebc = EmbeddingBagCollection(
            tables, fused_optimizer=FusedOptimizerConfig(optimizer="rowwise_adagrad", lr=lr)
        )
        width = dense_features + sum(t.embedding_dim * len(t.feature_names) for t in tables)
        self.mlp = nn.Sequential(nn.Linear(width, 64), nn.ReLU(), nn.Linear(64, 1))

    def forward(self, dense: torch.Tensor, kjt: KeyedJaggedTensor) -> torch.Tensor:
        pooled = self.ebc(kjt).values()
        return self.mlp(torch.cat([dense, pooled], dim=1)).squeeze(-1)


class SyntheticClicks:
    """Batches whose label is Bernoulli(sigmoid(sum of hidden id scores + a dense term)).

    The hidden scores depend only on the seed; the examples also on ``rank``, so every rank of a distributed
    run sees its own examples of the same task.
    """

    def __init__(self, cfg: DemoConfig, keys: list[str], rank: int = 0) -> None:
        self.cfg, self.keys = cfg, keys
        truth = torch.Generator().manual_seed(cfg.seed)
        self.id_score = torch.randn(len(keys), cfg.num_embeddings, generator=truth)
        self.dense_w = torch.randn(cfg.dense_features, generator=truth) * 0.5
        self.gen = torch.Generator().manual_seed(cfg.seed * 1000 + rank + 1)

    def batch(self) -> tuple[torch.Tensor, KeyedJaggedTensor, torch.Tensor]:
        cfg, g = self.cfg, self.gen
        num_keys, b = len(self.keys), cfg.batch_size
        lengths = torch.randint(1, cfg.max_ids_per_feature + 1, (num_keys * b,), generator=g)
        values = torch.randint(0, cfg.num_embeddings, (int(lengths.sum()),), generator=g)
        key_of_value = torch.repeat_interleave(torch.arange(num_keys), lengths.view(num_keys, b).sum(1))
        example_of_value = torch.repeat_interleave(torch.arange(num_keys * b) % b, lengths)
        score = torch.zeros(b).index_add_(0, example_of_value, self.id_score[key_of_value, values])
        dense = torch.randn(b, cfg.dense_features, generator=g)
        logit = score / cfg.max_ids_per_feature + dense @ self.dense_w
        labels = torch.bernoulli(torch.sigmoid(logit), generator=g)
        kjt = KeyedJaggedTensor.from_lengths_sync(keys=self.keys, values=values, lengths=lengths)
        return dense, kjt, labels


def run_demo(cfg: DemoConfig, env: ShardingEnv | None = None) -> DemoSummary:
    """Train the demo model; with ``env`` its tables are sharded over the ranks by the planner (DMP)."""
    torch.manual_seed(cfg.seed)
    tables = [
        EmbeddingBagConfig(name=f"t{i}", num_embeddings=cfg.num_embeddings, embedding_dim=cfg.embedding_dim)
        for i in range(cfg.num_tables)
    ]
    model: nn.Module = DemoModel(tables, cfg.dense_features, cfg.lr)
    if env is None:
        sparse_opt = model.ebc.fused_optimizer
    else:
        model = DistributedModelParallel(model, env=env, batch_size=cfg.batch_size)
        sparse_opt = model.fused_optimizer
    dense_params = [p for _, p in model.named_parameters() if p.requires_grad]
    optimizer = CombinedOptimizer(
        [("dense", torch.optim.Adagrad(dense_params, lr=cfg.lr)), ("sparse", sparse_opt)]
    )
    world_size, rank = (1, 0) if env is None else (env.world_size, env.rank)
    data = SyntheticClicks(cfg, keys=[t.feature_names[0] for t in tables], rank=rank)
    loss_fn = nn.BCEWithLogitsLoss()
    losses: list[float] = []
    start = time.perf_counter()
    for _ in range(cfg.steps):
        dense, kjt, labels = data.batch()
        loss = loss_fn(model(dense, kjt), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    seconds = time.perf_counter() - start
    with torch.no_grad():
        dense, kjt, labels = data.batch()
        accuracy = ((model(dense, kjt) > 0).float() == labels).float().mean().item()
    window = max(1, cfg.steps // 10)
    return DemoSummary(
        tables=[t.name for t in tables],
        steps=cfg.steps,
        examples=cfg.steps * cfg.batch_size * world_size,
        seconds=seconds,
        first_loss=sum(losses[:window]) / window,
        last_loss=sum(losses[-window:]) / window,
        accuracy=accuracy,
        losses=losses,
        plan_report="" if env is None else model.plan.report(),
    )
