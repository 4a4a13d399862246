"""A publish directory with base 1 of a small DLRM and deltas of random row subsets, and full exports of the
same weights to compare with (shared by the delta writer, reader and predictor tests)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from recserve.export import export_package, synthetic_sample
from recserve.export.delta import write_delta
from recserve.export.exporter import split_state_dict
from recserve.runtime.assembly import build_skeleton, table_weight_key
from rectrain.models.config import ModelConfig
from tests.export.common import dlrm_config, trained_state

CFG = dlrm_config()
ROWS = 250, 459  # rows of 700 that cpu:0 / cpu:1 hold: t0 and t2 whole on cpu:1, t1 on cpu:0, t3 split


def split_capacity(row_bytes: int) -> dict[str, float]:
    """Capacities that make ``plan_placement`` split table t3 of ``CFG`` over cpu:0 and cpu:1."""
    return {"cpu:0": ROWS[0] * row_bytes, "cpu:1": ROWS[1] * row_bytes}


def export(path: Path, cfg: ModelConfig, state: dict[str, Tensor], **options: Any) -> Path:
    return export_package(
        path,
        model_config=cfg,
        state_dict=state,
        accuracy_sample=synthetic_sample(cfg, 64),
        force=True,
        **options,
    )


def changed(
    cfg: ModelConfig, state: dict[str, Tensor], seed: int, tables: tuple[str, ...] | None = None
) -> tuple[dict[str, Tensor], dict[str, tuple[Tensor, Tensor]]]:
    """``(new state, {table: (ids in random order, new fp32 rows)})``: a random subset of rows of each of
    ``tables`` (default all) gets new values, and every dense weight moves a little."""
    gen = torch.Generator().manual_seed(seed)
    _, ebc_path = build_skeleton(cfg)
    new = {k: v.clone() for k, v in state.items()}
    rows = {}
    for table in cfg.tables:
        if tables is not None and table.name not in tables:
            continue
        key = table_weight_key(ebc_path, table.name)
        count = int(torch.randint(1, table.num_embeddings // 3, (1,), generator=gen))
        ids = torch.randperm(table.num_embeddings, generator=gen)[:count]
        values = torch.randn(count, table.embedding_dim, generator=gen) * 0.3
        new[key][ids] = values
        rows[table.name] = (ids, values)
    _, dense = split_state_dict(cfg, new)
    for key, value in dense.items():
        if value.is_floating_point():
            new[key] = value + 0.01 * torch.randn(value.shape, generator=gen)
    return new, rows


def dense_of(cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
    return split_state_dict(cfg, state)[1]


@dataclass
class Stream:
    """Base 1 exported from ``states[0]`` into ``publish``; delta k holds the rows changed from state k-1
    to state k."""

    cfg: ModelConfig
    publish: Path
    options: dict[str, Any]
    states: list[dict[str, Tensor]] = field(default_factory=list)

    @property
    def base(self) -> Path:
        return self.publish / "1"

    def publish_delta(self, seed: int, tables: tuple[str, ...] | None = None) -> Path:
        state, rows = changed(self.cfg, self.states[-1], seed, tables)
        self.states.append(state)
        sequence = len(self.states) - 1
        return write_delta(
            self.publish,
            "1",
            sequence,
            100 * sequence,
            rows,
            dense_of(self.cfg, state),
            wall_time=1e9 + sequence,
        )

    def full_export(self, path: Path) -> Path:
        """A full export of the newest state, as the base was exported."""
        return export(path, self.cfg, self.states[-1], **self.options)


def make_stream(publish: Path, cfg: ModelConfig = CFG, seed: int = 0, **options: Any) -> Stream:
    state = trained_state(cfg, seed)
    export(publish / "1", cfg, state, version="1", **options)
    return Stream(cfg, publish, options, [state])
