"""One training run of a managed-collision model, importable from ``torchrec`` or ``rectrain``.

Two tables behind MCH remappers (distance-weighted LFU every 2 steps; LFU with an average-count filter every
step) in a ``ManagedCollisionEmbeddingBagCollection``, a linear head, Adam, 20 steps on skewed unbounded ids.
Run as ``python mc_parity_job.py <torchrec|rectrain> <dir>``: the first run writes the initial state dict and
the data to ``<dir>``, later runs load them; each writes its losses, remapped ids and final state.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import torch
from torch import nn

TABLES = [("users", 16), ("products", 12)]
DIM, BATCH, STEPS = 8, 16, 20


def _data(gen: torch.Generator) -> list[dict[str, torch.Tensor]]:
    popular = torch.randint(0, 2**40, (24,), generator=gen)
    batches = []
    for _ in range(STEPS):
        pick = torch.randint(0, 24, (BATCH * len(TABLES),), generator=gen)
        fresh = torch.randint(0, 2**40, (BATCH * len(TABLES),), generator=gen)
        use_fresh = torch.rand(BATCH * len(TABLES), generator=gen) < 0.3
        ids = torch.where(use_fresh, fresh, popular[pick])
        batches.append({"ids": ids, "label": torch.rand(BATCH, generator=gen)})
    return batches


def _model(package: str) -> nn.Module:
    configs = importlib.import_module(f"{package}.modules.embedding_configs")
    modules = importlib.import_module(f"{package}.modules.embedding_modules")
    mc = importlib.import_module(f"{package}.modules.mc_modules")
    mc_emb = importlib.import_module(f"{package}.modules.mc_embedding_modules")
    tables = [
        configs.EmbeddingBagConfig(name=name, embedding_dim=DIM, num_embeddings=rows, feature_names=[name])
        for name, rows in TABLES
    ]
    cpu = torch.device("cpu")
    remappers = {
        "users": mc.MCHManagedCollisionModule(
            zch_size=16, device=cpu, eviction_interval=2, eviction_policy=mc.DistanceLFU_EvictionPolicy()
        ),
        "products": mc.MCHManagedCollisionModule(
            zch_size=12,
            device=cpu,
            eviction_interval=1,
            eviction_policy=mc.LFU_EvictionPolicy(threshold_filtering_func=mc.average_threshold_filter),
        ),
    }
    mc_ebc = mc_emb.ManagedCollisionEmbeddingBagCollection(
        modules.EmbeddingBagCollection(tables=tables, device=cpu),
        mc.ManagedCollisionCollection(remappers, tables),
        return_remapped_features=True,
    )
    return nn.ModuleDict({"mc_ebc": mc_ebc, "head": nn.Linear(DIM * len(TABLES), 1)})


def main(package: str, out: Path) -> None:
    sparse = importlib.import_module(f"{package}.sparse.jagged_tensor")
    torch.manual_seed(0)
    model = _model(package)
    start = out / "initial.pt"
    if not start.exists():
        torch.save({"state": model.state_dict(), "data": _data(torch.Generator().manual_seed(1))}, start)
    saved = torch.load(start, weights_only=True)
    model.load_state_dict(saved["state"])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    losses, remapped = [], []
    for batch in saved["data"]:
        kjt = sparse.KeyedJaggedTensor(
            keys=[name for name, _ in TABLES],
            values=batch["ids"],
            lengths=torch.ones(BATCH * len(TABLES), dtype=torch.int64),
        )
        pooled, rows = model["mc_ebc"](kjt)
        logits = model["head"](pooled.values()).squeeze(1)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, batch["label"])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        remapped.append(rows.values().clone())
    torch.save({"losses": losses, "remapped": remapped, "state": model.state_dict()}, out / f"{package}.pt")


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
