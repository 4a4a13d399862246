"""The held-out AUC reachable from a rule's training rows by a model that knows the rule's form.

``best_auc`` (bench/foreign_criteo.py) scores the true probabilities: what no model can beat, but also what
no model trained on 150,000 rows can reach. This fits the rule's own family to its training rows, the MAP
estimate under the rule's own priors: one weight per token of each column (Gaussian prior of that column's
token std), one per cell of each interacting pair (prior of the pair std), and a per-column linear (or,
for ``bump``, quadratic) function of log1p of each integer as the reader reads it (empty -> 0, so an empty
value's own effect, ``missing_effect``, is out of reach as it is for the recipes). Full-batch L-BFGS to
convergence, so no optimiser or epoch limit stands between the rows and the estimate.

    python bench/foreign_ceiling.py RULE [RULE ...]

Rules with huge pair tables (``kaggle``) are out of reach of a one-hot fit on a small machine. Latent dot
products, split effects and integer steps (``latent``, ``trees``) are not in the fitted family: for those
rules this is the best first-order fit, not the family's.
"""

from __future__ import annotations

import math
import sys

import foreign_criteo as fc
import torch
import torch.nn.functional as F
from machine import print_machine


def _rows(rule: fc.Rule, n: int, seed: int):
    """write_rows's rows: ids (0 = empty), log1p counts as read, labels, p."""
    r = fc.draw_rows(rule, fc._Draw(rule), n, seed)
    x = torch.log1p(r.counts.clamp(min=0).masked_fill(r.dense_missing, 0).float())
    return torch.where(r.cat_missing, 0, r.toks + 1), x, r.labels, r.p


def ceiling(rule: fc.Rule) -> tuple[float, float]:
    """(MAP fit's held-out AUC, best_auc) for ``rule``."""
    train = _rows(rule, rule.train_rows, 10 * rule.seed + 1)
    test = _rows(rule, rule.test_rows, 10 * rule.seed + 2)
    cards = [c + 1 for c in rule.cardinality]
    std = [
        rule.scale * rule.token_std * (1.0 if not rule.strong or j in rule.strong else rule.weak)
        for j in range(fc.NUM_SPARSE)
    ]
    prior = [torch.full((c,), s / math.sqrt(fc.NUM_SPARSE)) for c, s in zip(cards, std)]
    offsets, columns = torch.tensor([0, *cards[:-1]]).cumsum(0), []
    base = sum(cards)
    for a, b in rule.pairs:
        columns.append((a, b, base))
        prior.append(torch.full((cards[a] * cards[b],), rule.scale * rule.pair_std))
        base += cards[a] * cards[b]
    inv_var = 1.0 / torch.cat(prior) ** 2

    def features(rows):
        ids, x = rows[0], rows[1]
        onehot = [ids + offsets] + [(at + ids[:, a] * cards[b] + ids[:, b])[:, None] for a, b, at in columns]
        dense = [x] + ([x * x] if rule.dense_shape == "bump" else [])
        return torch.cat(onehot, 1), torch.cat(dense, 1)

    (ids, dense), (test_ids, test_dense) = features(train), features(test)
    mean, scale = dense.mean(0), dense.std(0).clamp(min=1e-6)
    dense, test_dense = (dense - mean) / scale, (test_dense - mean) / scale
    w = torch.zeros(base, requires_grad=True)
    v = torch.zeros(dense.shape[1], requires_grad=True)
    b = torch.zeros(1, requires_grad=True)
    opt = torch.optim.LBFGS([w, v, b], max_iter=300, history_size=20, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(w[ids].sum(1) + dense @ v + b, train[2])
        loss = loss + (inv_var * w * w).sum() / (2 * len(ids))  # the Gaussian priors, per row
        loss.backward()
        return loss

    opt.step(closure)
    with torch.no_grad():
        scores = w[test_ids].sum(1) + test_dense @ v + b
    return fc.auc_of(scores, test[2]), fc.auc_of(test[3], test[2])


def main(argv: list[str]) -> None:
    print_machine()
    torch.set_num_threads(1)
    for name in argv or ["probe"]:
        fitted, best = ceiling(fc.RULES[name])
        print(f"{name}: best possible AUC {best:.4f}; the rule's own family fitted to its rows {fitted:.4f}")


if __name__ == "__main__":
    main(sys.argv[1:])
