"""One training run of a TorchRec-style rating model, importable from ``torchrec`` or ``rectrain``.

The pattern of TorchRec's ``examples/prediction``: an ``EmbeddingBagCollection`` built without any optimizer
setting, a dense MLP, ``Adam(model.parameters(), weight_decay=1e-5)``, ``StepLR``, gradient clipping and MSE.
Run as ``python unsharded_parity_job.py <torchrec|rectrain> <dir>``: the first run writes the initial state
dict and the data to ``<dir>``, later runs load them; each writes its per-step losses and final tables.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch
from torch import nn

TABLES = [("user", 100), ("item", 60), ("user_category", 10), ("item_category", 20)]
DIM, BATCH, STEPS = 16, 32, 20


class RatingModel(nn.Module):
    def __init__(self, ebc: nn.Module) -> None:
        super().__init__()
        self.ebc = ebc
        self.dense = nn.Sequential(nn.Linear(4, DIM), nn.ReLU())
        self.over = nn.Sequential(nn.Linear(DIM * (len(TABLES) + 1), 32), nn.ReLU(), nn.Linear(32, 1))

    def forward(self, dense: torch.Tensor, kjt) -> torch.Tensor:
        pooled = self.ebc(kjt)
        features = [self.dense(dense)] + [pooled[name] for name, _ in TABLES]
        return torch.sigmoid(self.over(torch.cat(features, dim=1)).squeeze(1)) * 5.0


def _data(gen: torch.Generator) -> list[dict[str, torch.Tensor]]:
    return [
        {
            "ids": torch.cat([torch.randint(0, rows, (BATCH,), generator=gen) for _, rows in TABLES]),
            "dense": torch.rand(BATCH, 4, generator=gen),
            "rating": torch.randint(0, 6, (BATCH,), generator=gen).float(),
        }
        for _ in range(STEPS)
    ]


def main(package: str, out: Path) -> None:
    modules = importlib.import_module(f"{package}.modules.embedding_modules")
    configs = importlib.import_module(f"{package}.modules.embedding_configs")
    sparse = importlib.import_module(f"{package}.sparse.jagged_tensor")
    tables = [
        configs.EmbeddingBagConfig(name=name, embedding_dim=DIM, num_embeddings=rows, feature_names=[name])
        for name, rows in TABLES
    ]
    torch.manual_seed(0)
    model = RatingModel(modules.EmbeddingBagCollection(tables=tables, device=torch.device("cpu")))
    start = out / "initial.pt"
    if not start.exists():
        torch.save({"state": model.state_dict(), "data": _data(torch.Generator().manual_seed(1))}, start)
    saved = torch.load(start, weights_only=True)
    model.load_state_dict(saved["state"])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=1e-5)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=5, gamma=0.5)
    losses = []
    for batch in saved["data"]:
        kjt = sparse.KeyedJaggedTensor(
            keys=[name for name, _ in TABLES],
            values=batch["ids"],
            lengths=torch.ones(BATCH * len(TABLES), dtype=torch.int32),
        )
        loss = nn.functional.mse_loss(model(batch["dense"], kjt), batch["rating"])
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
        optimizer.step()
        scheduler.step()
        losses.append(loss.item())
    tables_after = {k: v for k, v in model.state_dict().items() if "embedding_bags" in k}
    torch.save({"losses": losses, "tables": tables_after}, out / f"{package}.pt")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
