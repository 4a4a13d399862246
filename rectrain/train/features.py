"""The model's sparse features and their table sizes, checked against the features a data source has."""

from __future__ import annotations

from rectrain.errors import ConfigError
from rectrain.train.config import RunConfig


def feature_rows(config: RunConfig) -> dict[str, int]:
    """``{feature: rows of the table that reads it}`` from the model's tables (the smallest if several)."""
    rows: dict[str, int] = {}
    for table in config.model.tables:
        for feature in table.feature_names:
            rows[feature] = min(rows.get(feature, table.num_embeddings), table.num_embeddings)
    return rows


def require_features(source: str, what: str, names: list[str], rows: dict[str, int], *, exact: bool) -> None:
    """The model's tables must read exactly the data's features (``exact``) or at least these."""
    missing = [n for n in names if n not in rows]
    extra = sorted(set(rows) - set(names)) if exact else []
    if missing or extra:
        shown = f"{names[0]}..{names[-1]} ({len(names)})" if len(names) > 4 else str(names)
        raise ConfigError(
            f"{source}: model.tables: {what} have the features {shown}; the tables read {sorted(rows)}"
            + (f"; missing {missing}" if missing else "")
            + (f"; unknown {extra}" if extra else "")
        )
