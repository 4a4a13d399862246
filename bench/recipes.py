"""The DLRM Criteo recipe against a plain PyTorch model, on Criteo-format rows of a rule it was not tuned on.

    python bench/recipes.py gen 60000 20000     # writes /tmp/recipes/{train,test}.tsv, prints the best AUC
    python bench/recipes.py plain 60 120 240    # plain model's held-out AUC after these many steps
    rectrain train --config examples/dlrm_criteo.toml --set 'data.paths=["/tmp/recipes/train.tsv"]' \\
        --set 'data.eval_paths=["/tmp/recipes/test.tsv"]' --set train.steps=60 --set train.batch_size=1024

The rule (unlike ``rectrain.datasets.criteo_synthetic``): columns of very different cardinality (10 to
100,000 tokens, Zipf), a pairwise interaction between two columns, heavy-tailed dense counts with negative
values in one column, and hex ids hashed differently per column. ``gen`` prints the AUC of the true
probabilities on the held-out rows: the best any model can reach.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import torch
from torch import nn

from rectrain.datasets.criteo import parse_criteo_line
from rectrain.metrics.functional import auc

OUT = Path("/tmp/recipes")
CARDINALITY = [10, 500, 30000, 200, 5000, 50, 2000, 100000, 80, 700] * 3


def write_rows(path: Path, n: int, seed: int) -> torch.Tensor:
    """Write ``n`` rows to ``path``; return the true click probabilities (the rule is fixed, rows vary)."""
    rule = torch.Generator().manual_seed(1234)
    card = CARDINALITY[:26]
    scores = [torch.randn(c, generator=rule) * 0.6 for c in card]
    pair = torch.randn(50, 80, generator=rule) * 0.8  # columns 5 and 8 interact
    dense_w = torch.randn(13, generator=rule) * 0.4
    salt = torch.randint(0, 2**31, (26,), generator=rule)
    rows = torch.Generator().manual_seed(seed)
    toks = []
    for c in card:
        z = torch.arange(1, c + 1, dtype=torch.float64).pow(-1.1)
        toks.append(torch.multinomial(z / z.sum(), n, replacement=True, generator=rows))
    toks = torch.stack(toks, 1)
    dense = (-torch.log(torch.rand(n, 13, generator=rows)) * 20).floor().long()
    dense[:, 1] -= 3  # negative counts, as in Criteo's second integer column
    logit = sum(scores[j][toks[:, j]] for j in range(26)) / math.sqrt(26) * 1.5
    logit = logit + pair[toks[:, 5], toks[:, 8]]
    logit = logit + (torch.log1p(dense.clamp(min=0).float()) - 2.5) @ dense_w - 1.0
    p = torch.sigmoid(logit)
    y = torch.bernoulli(p, generator=rows).long()
    with open(path, "w") as f:
        for i in range(n):
            cats = [f"{(t * 2654435761 + h) % 2**32:08x}" for t, h in zip(toks[i].tolist(), salt.tolist())]
            f.write("\t".join([str(int(y[i])), *map(str, dense[i].tolist()), *cats]) + "\n")
    return p


def read(path: Path, rows: int = 100_000) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    with open(path) as f:
        parsed = [parse_criteo_line(line.rstrip("\n"), [rows] * 26) for line in f]
    return (
        torch.tensor([p[0] for p in parsed], dtype=torch.float32),
        torch.tensor([p[1] for p in parsed]),
        torch.tensor([p[2] for p in parsed]),
    )


def plain_auc(train, test, steps: int, rows: int = 100_000, batch: int = 1024) -> float:
    """26 ``nn.Embedding`` of dim 16, log1p dense, MLP 256-64-1, Adagrad 0.05, ``steps`` steps."""
    torch.manual_seed(0)
    tables = nn.ModuleList(nn.Embedding(rows, 16, sparse=True) for _ in range(26))
    mlp = nn.Sequential(
        nn.Linear(13 + 26 * 16, 256), nn.ReLU(), nn.Linear(256, 64), nn.ReLU(), nn.Linear(64, 1)
    )

    def logits(dense, ids):
        return mlp(torch.cat([dense, *(t(ids[:, i]) for i, t in enumerate(tables))], 1)).squeeze(1)

    opt = torch.optim.Adagrad([*tables.parameters(), *mlp.parameters()], lr=0.05)
    labels, dense, ids = train
    done = 0
    while done < steps:
        for idx in torch.randperm(len(labels)).split(batch)[: steps - done]:
            loss = nn.functional.binary_cross_entropy_with_logits(logits(dense[idx], ids[idx]), labels[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            done += 1
    with torch.no_grad():
        return auc(logits(test[1], test[2]), test[0])


def main(argv: list[str]) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    if argv[0] == "gen":
        write_rows(OUT / "train.tsv", int(argv[1]), seed=1)
        p = write_rows(OUT / "test.tsv", int(argv[2]), seed=2)
        labels = read(OUT / "test.tsv")[0]
        print(f"best possible held-out AUC: {auc(p, labels):.4f}")
    else:
        train, test = read(OUT / "train.tsv"), read(OUT / "test.tsv")
        for steps in map(int, argv[1:]):
            print(f"plain model, {steps} steps: held-out AUC {plain_auc(train, test, steps):.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
