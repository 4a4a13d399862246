"""The rows an accuracy sample touches: the accuracy gate runs on a model holding only those.

Export streams each table a slice at a time and never holds a whole model, yet the accuracy report compares
the fp32 model with the quantized one on a held-out sample. A sample of a few thousand examples reads a few
thousand rows per table, so the report runs on a *compact* model: each table cut to the rows its sample
reads, the sample's ids renumbered to match. Row-wise quantization treats every row on its own, so the
compact model's logits are the full model's.

A feature read by several tables must keep one id for all of them, so the rows are chosen per group of
tables linked by shared features: each table of a group keeps the union of its group's ids (a row past a
table's own end, which only another table's features can name, is zero there and never read).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import Tensor

from recserve.export.accuracy import AccuracySample
from rectrain.models.config import ModelConfig
from rectrain.sparse import KeyedJaggedTensor


@dataclass
class CompactSample:
    """The compact model's config, the sample with renumbered ids, and each table's kept rows (sorted)."""

    config: ModelConfig
    sample: AccuracySample
    rows: dict[str, Tensor]


def _groups(cfg: ModelConfig) -> dict[str, str]:
    """Each table's group (a representative table name): tables linked by a shared feature, transitively."""
    parent = {t.name: t.name for t in cfg.tables}

    def root(name: str) -> str:
        while parent[name] != name:
            name = parent[name]
        return name

    reader: dict[str, str] = {}
    for table in cfg.tables:
        for feature in table.feature_names:
            if feature in reader:
                parent[root(table.name)] = root(reader[feature])
            reader[feature] = table.name
    return {t.name: root(t.name) for t in cfg.tables}


def compact_sample(cfg: ModelConfig, sample: AccuracySample) -> CompactSample:
    """The compact model of ``cfg`` for ``sample`` (see the module docstring)."""
    kjt = sample.kjt
    ids = dict(zip(kjt.keys(), kjt.values().split(kjt.length_per_key())))
    group_of = _groups(cfg)
    features = {g: set() for g in group_of.values()}
    for table in cfg.tables:
        features[group_of[table.name]].update(table.feature_names)
    kept = {
        g: torch.unique(
            torch.cat(
                [ids[f].long() for f in sorted(names) if f in ids] or [torch.zeros(0, dtype=torch.long)]
            )
        )
        for g, names in features.items()
    }
    group_of_feature = {f: group_of[t.name] for t in cfg.tables for f in t.feature_names}
    values = [
        torch.searchsorted(kept[group_of_feature[key]], ids[key].long())
        if key in group_of_feature
        else ids[key]
        for key in list(kjt.keys())
    ]
    renumbered = KeyedJaggedTensor.from_lengths_sync(
        keys=kjt.keys(),
        values=torch.cat(values) if values else kjt.values(),
        lengths=kjt.lengths(),
        weights=kjt.weights_or_none(),
    )
    rows = {t.name: kept[group_of[t.name]].long() for t in cfg.tables}
    tables = [dataclasses.replace(t, num_embeddings=max(1, rows[t.name].numel())) for t in cfg.tables]
    return CompactSample(
        dataclasses.replace(cfg, tables=tables),
        AccuracySample(sample.dense, renumbered, sample.labels),
        rows,
    )
