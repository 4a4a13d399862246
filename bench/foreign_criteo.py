"""Criteo-format rows of labelling rules nobody tuned a recipe on, with the best AUC each allows.

A rule draws 26 categorical columns (own cardinality, Zipf popularity, 32-bit hex ids like Criteo's, some
empty) and 13 integer columns (counts of a chosen distribution, empty at a rate, negatives in int_1 as in
Criteo), and labels each row Bernoulli(sigmoid(logit)) with

    logit = bias + scale * (sum of token effects / sqrt(26) + pair effects + latent dot products
                            + split effects + dense effects)

Token effects are Gaussian per token (so rare tokens carry signal that only many rows reveal); pair effects
are Gaussian per (token of column a, token of column b), an interaction no first-order model sees; latent
dot products sum <v_a, v_b> over all column pairs of per-token Gaussian vectors (a low-rank interaction, as
DLRM models it); split effects give a token one Gaussian effect below an integer column's threshold and
another above it. Dense effects are linear in log1p of the count, or a bump (highest in the middle of the
range) that a linear model misses, plus optional steps at thresholds (as a tree splits). ``best_auc`` is the
AUC of the true probabilities on the held-out rows: what no model can beat.

    python bench/foreign_criteo.py gen [RULE ...]   # writes /tmp/foreign/<rule>/{train,test}.tsv
    python bench/foreign_runs.py run RECIPE RULE    # docs/training.md's command on them, vs best and plain
    python bench/foreign_runs.py table [--ranks 1,2] [RULE ...]   # every recipe on every rule
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

OUT = Path("/tmp/foreign")
NUM_DENSE, NUM_SPARSE = 13, 26


@dataclass(frozen=True)
class Rule:
    """A labelling rule and the shape of its rows (see the module docstring)."""

    name: str
    cardinality: tuple[int, ...]
    train_rows: int = 150_000
    test_rows: int = 20_000
    zipf: float = 1.1
    token_std: float = 0.6
    strong: tuple[int, ...] = ()  # columns with token_std; the others get weak * token_std (all when empty)
    weak: float = 0.2
    pairs: tuple[tuple[int, int], ...] = ()
    pair_std: float = 0.8
    latent_dim: int = 0  # > 0: a latent vector per token too; each pair of columns adds their dot product
    latent_std: float = 0.5
    dense_std: float = 0.3
    dense_shape: str = "log"  # "log" (linear in log1p) or "bump"
    step_std: float = 0.0  # > 0: and a step at each of 3 thresholds of each integer column, as trees split
    splits: tuple[tuple[int, int], ...] = ()  # (integer, categorical): token effects flip at a threshold
    split_std: float = 0.6
    dense_mean: tuple[float, ...] = field(default=(20.0,) * NUM_DENSE)
    dense_tail: str = "exponential"  # or "lognormal": counts up to millions
    dense_missing: float = 0.1
    cat_missing: float = 0.03
    missing_effect: bool = (
        False  # an empty integer has its own effect (else: that of a 0, as the reader reads it)
    )
    bias: float = -1.2
    scale: float = 1.0
    seed: int = 0


def _cards(*pattern: int) -> tuple[int, ...]:
    return tuple((pattern * NUM_SPARSE)[:NUM_SPARSE])


# Criteo Kaggle's distinct values per column (to 2 digits): hashed into 100k rows, the big ones collide.
KAGGLE_CARDINALITY = (
    1_400, 550, 2_200_000, 310_000, 300, 24, 12_500, 630, 3, 93_000, 5_700, 1_800_000, 3_200,
    27, 14_900, 1_300_000, 10, 5_700, 2_200, 4, 1_700_000, 17, 15, 140_000, 100, 91_000,
)  # fmt: skip

RULES = {
    r.name: r
    for r in [
        # Mixed cardinalities (3 to 3,000), one interaction: shaped like the probe (best ~0.715).
        Rule(
            "probe",
            _cards(3, 40, 1_000, 10, 100, 50, 500, 20, 80, 7, 3_000),
            pairs=((5, 8),),
            token_std=0.9,
            scale=0.5,
        ),
        # Many large long-tailed columns: much of the signal sits in tokens seen a few times.
        Rule(
            "wide", _cards(50_000, 200_000, 3_000, 20_000, 400), zipf=1.05, token_std=0.7, scale=0.7, seed=1
        ),
        # Interactions carry as much signal as first-order effects.
        Rule(
            "pairs",
            _cards(20, 300, 1_000, 60, 5_000, 40),
            pairs=((0, 1), (3, 5), (2, 7), (10, 11)),
            pair_std=0.9,
            token_std=0.4,
            scale=0.45,
            seed=2,
        ),
        # Heavy-tailed dense counts (up to millions), a non-monotone dense effect, many empty values.
        Rule(
            "dense",
            _cards(100, 1_000, 10_000),
            dense_tail="lognormal",
            dense_shape="bump",
            dense_std=0.5,
            dense_missing=0.35,
            missing_effect=True,
            token_std=0.4,
            scale=0.5,
            seed=3,
        ),
        # Little signal, low click rate.
        Rule("faint", _cards(30, 3_000, 300, 30_000), token_std=0.5, bias=-2.2, scale=0.45, seed=4),
        # Criteo Kaggle's cardinalities (up to 2.2M distinct values, hashed into the recipe's 100k rows).
        Rule("kaggle", KAGGLE_CARDINALITY, zipf=1.1, pairs=((8, 19), (5, 22)), scale=0.6, seed=5),
        # The rules below are calibrated like the file: best AUC 0.70-0.73, the plain model (one
        # epoch) 0.015-0.025 short of it. Low-rank interactions: a 4-dim latent vector per token too, every
        # column pair adds the dot product of its two tokens' vectors (what DLRM's interaction assumes).
        Rule(
            "latent",
            _cards(3, 10, 20, 50),
            latent_dim=4,
            latent_std=0.4,
            token_std=0.9,
            bias=-1.5,
            scale=0.5,
            seed=6,
        ),
        # Four columns carry the token signal, the other 22 a seventh as much.
        Rule(
            "few",
            _cards(30, 40, 20, 10, 50, 30, 30, 40, 10, 20, 50),
            strong=(2, 5, 8, 10),
            token_std=1.5,
            weak=0.15,
            dense_std=0.4,
            bias=-1.8,
            scale=0.6,
            seed=7,
        ),
        # Tree-like: integer effects with steps at thresholds, tokens whose effect flips across one.
        Rule(
            "trees",
            _cards(3, 10, 20, 50),
            step_std=0.15,
            splits=((0, 3), (4, 10), (7, 17)),
            split_std=0.2,
            token_std=0.9,
            bias=-0.8,
            scale=0.5,
            seed=8,
        ),
        # Criteo Kaggle's cardinalities, steeper popularity, click rate ~0.15, most signal in the integers.
        Rule(
            "hashed",
            KAGGLE_CARDINALITY,
            zipf=1.6,
            token_std=0.4,
            dense_std=0.45,
            bias=-2.0,
            scale=0.6,
            seed=9,
        ),
        # probe's columns and interaction, with more of the signal in the integers.
        Rule(
            "mixed",
            _cards(3, 40, 1_000, 10, 100, 50, 500, 20, 80, 7, 3_000),
            pairs=((5, 8),),
            token_std=0.9,
            dense_std=0.6,
            scale=0.32,
            seed=11,
        ),
    ]
}


class _Draw:
    """The rule's fixed parameters (effects, hex ids), drawn once from the rule's seed."""

    def __init__(self, rule: Rule) -> None:
        g = torch.Generator().manual_seed(1000 + rule.seed)
        self.hexes = [torch.randint(0, 2**32, (c,), generator=g, dtype=torch.int64) for c in rule.cardinality]
        std = [
            rule.token_std * (1.0 if not rule.strong or j in rule.strong else rule.weak) for j in range(26)
        ]
        self.effects = [torch.randn(c, generator=g) * s for c, s in zip(rule.cardinality, std)]
        self.pairs = [
            torch.randn(rule.cardinality[a], rule.cardinality[b], generator=g) * rule.pair_std
            if rule.cardinality[a] * rule.cardinality[b] <= 5_000_000
            else None
            for a, b in rule.pairs
        ]
        self.dense_w = torch.randn(NUM_DENSE, generator=g) * rule.dense_std
        self.dense_center = torch.rand(NUM_DENSE, generator=g) * 3 + 1  # bump peaks, in log1p units
        # Drawn after the fields above so that the older rules' draws stay as they were.
        cards = rule.cardinality
        self.latent = [torch.randn(c, rule.latent_dim, generator=g) * rule.latent_std for c in cards]
        self.steps = torch.rand(NUM_DENSE, 3, generator=g) * 3.5 + 0.5  # step thresholds, log1p units
        self.step_w = torch.randn(NUM_DENSE, 3, generator=g) * rule.step_std
        self.splits = [torch.randn(2, cards[c], generator=g) * rule.split_std for _, c in rule.splits]


def _dense(rule: Rule, n: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(integer counts [n, 13], missing mask [n, 13])."""
    mean = torch.tensor(rule.dense_mean)
    if rule.dense_tail == "lognormal":
        counts = torch.exp(torch.randn(n, NUM_DENSE, generator=g) * 2.0 + torch.log(mean)).floor()
    else:
        counts = (-torch.log(torch.rand(n, NUM_DENSE, generator=g)) * mean).floor()
    counts = counts.clamp(max=2**40).long()
    counts[:, 1] -= 3  # Criteo's int_1 has negative values
    return counts, torch.rand(n, NUM_DENSE, generator=g) < rule.dense_missing


def _logit(rule: Rule, d: _Draw, toks: torch.Tensor, cat_missing, counts, dense_missing) -> torch.Tensor:
    first = sum(d.effects[j][toks[:, j]].masked_fill(cat_missing[:, j], 0.0) for j in range(NUM_SPARSE))
    total = first / math.sqrt(NUM_SPARSE)
    for (a, b), table in zip(rule.pairs, d.pairs):
        both = ~(cat_missing[:, a] | cat_missing[:, b])
        total = total + (table[toks[:, a], toks[:, b]] * both if table is not None else 0.0)
    if rule.latent_dim:  # sum over column pairs of <v_a, v_b>, as a factorisation machine (and DLRM) models
        v = torch.stack([d.latent[j][toks[:, j]] for j in range(NUM_SPARSE)], 1) * ~cat_missing[:, :, None]
        dots = (v.sum(1).pow(2).sum(1) - v.pow(2).sum((1, 2))) / 2
        total = total + dots / math.sqrt(NUM_SPARSE * (NUM_SPARSE - 1) / 2)
    x = torch.log1p(counts.clamp(min=0).masked_fill(dense_missing, 0).float())
    for (i, c), table in zip(rule.splits, d.splits):
        side = (x[:, i] > d.dense_center[i]).long()
        total = total + table[side, toks[:, c]].masked_fill(cat_missing[:, c], 0.0)
    if rule.step_std:
        steps = (((x[:, :, None] > d.steps).float() - 0.5) * d.step_w).sum(2)
        total = total + (steps.masked_fill(dense_missing, 0.0) if rule.missing_effect else steps).sum(1)
    x = -((x - d.dense_center) ** 2) / 4 + 1 if rule.dense_shape == "bump" else x - 2.5
    if rule.missing_effect:
        x = x.masked_fill(dense_missing, 0.0)
    total = total + x @ d.dense_w
    return rule.bias + rule.scale * total


@dataclass
class Rows:
    """Rows of a rule as drawn, before they are written as text."""

    toks: torch.Tensor  # [n, 26] token indices (0 = most popular)
    cat_missing: torch.Tensor  # [n, 26]
    counts: torch.Tensor  # [n, 13]
    dense_missing: torch.Tensor  # [n, 13]
    p: torch.Tensor  # [n] true click probabilities
    labels: torch.Tensor  # [n]


def draw_rows(rule: Rule, d: _Draw, n: int, seed: int) -> Rows:
    """``n`` rows of ``rule`` (the rule is fixed by ``d``; the rows vary with ``seed``)."""
    g = torch.Generator().manual_seed(seed)
    toks = []
    for c in rule.cardinality:
        z = torch.arange(1, c + 1, dtype=torch.float64).pow(-rule.zipf)
        toks.append(torch.multinomial(z / z.sum(), n, replacement=True, generator=g))
    toks = torch.stack(toks, 1)
    cat_missing = torch.rand(n, NUM_SPARSE, generator=g) < rule.cat_missing
    counts, dense_missing = _dense(rule, n, g)
    p = torch.sigmoid(_logit(rule, d, toks, cat_missing, counts, dense_missing))
    return Rows(toks, cat_missing, counts, dense_missing, p, torch.bernoulli(p, generator=g))


def write_rows(rule: Rule, path: Path, n: int, seed: int) -> torch.Tensor:
    """Write ``n`` rows of ``rule`` to ``path``; return the rows' true click probabilities."""
    d = _Draw(rule)
    rows = draw_rows(rule, d, n, seed)
    toks, cat_missing, counts, dense_missing = rows.toks, rows.cat_missing, rows.counts, rows.dense_missing
    p, labels = rows.p, rows.labels.long().tolist()
    hexes = torch.stack([d.hexes[j][toks[:, j]] for j in range(NUM_SPARSE)], 1).tolist()
    counts, cat_missing, dense_missing = counts.tolist(), cat_missing.tolist(), dense_missing.tolist()
    with open(path, "w") as f:
        for i in range(n):
            ints = ["" if m else str(v) for v, m in zip(counts[i], dense_missing[i])]
            cats = ["" if m else f"{v:08x}" for v, m in zip(hexes[i], cat_missing[i])]
            f.write("\t".join([str(labels[i]), *ints, *cats]) + "\n")
    return p


def auc_of(scores: torch.Tensor, labels: torch.Tensor) -> float:
    order = torch.argsort(scores.double())
    y = labels.double()[order]
    ranks = torch.arange(1, len(y) + 1, dtype=torch.float64)
    pos = y.sum()
    return float(((ranks * y).sum() - pos * (pos + 1) / 2) / (pos * (len(y) - pos)))


def generate(rule: Rule, out: Path = OUT) -> dict:
    """Write the rule's train/test files under ``out/<name>/``; return (and save) its facts."""
    where = out / rule.name
    where.mkdir(parents=True, exist_ok=True)
    write_rows(rule, where / "train.tsv", rule.train_rows, seed=10 * rule.seed + 1)
    p = write_rows(rule, where / "test.tsv", rule.test_rows, seed=10 * rule.seed + 2)
    labels = torch.tensor([int(line[0]) for line in (where / "test.tsv").read_text().splitlines()])
    facts = {
        "rule": asdict(rule),
        "best_auc": auc_of(p, labels),
        "test_ctr": float(labels.float().mean()),
        "train": str(where / "train.tsv"),
        "test": str(where / "test.tsv"),
    }
    (where / "facts.json").write_text(json.dumps(facts, indent=1))
    return facts


def main(argv: list[str]) -> None:
    if argv[:1] in (["run"], ["table"]):
        raise SystemExit(f"{argv[0]} is in bench/foreign_runs.py: python bench/foreign_runs.py {argv[0]} ...")
    for name in argv[1:] or list(RULES):
        facts = generate(RULES[name])
        print(f"{name}: best possible AUC {facts['best_auc']:.4f}, click rate {facts['test_ctr']:.3f}")


if __name__ == "__main__":
    main(sys.argv[1:])
