"""The ``converted`` and ``parquet`` sources of a run: a ``ColumnarConfig`` checked against the model.

Converted data name their features and the table sizes their ids were hashed into (the manifest); the model
must read those features from tables of those sizes. Parquet columns are named in ``[data]``; their ids are
hashed into the model's table sizes as they are read.
"""

from __future__ import annotations

from rectrain.datasets.columnar import ColumnarConfig, ColumnarManifest
from rectrain.errors import ConfigError
from rectrain.train.config import RunConfig
from rectrain.train.features import require_features


def columnar_dataset_config(config: RunConfig, paths: list[str], rows: dict[str, int]) -> ColumnarConfig:
    """The ``ColumnarConfig`` of a run reading ``paths``; ``rows``: each model feature's table size."""
    data, src = config.data, config.source
    common = {
        "paths": list(paths),
        "batch_size": config.train.batch_size,
        "shuffle": data.shuffle,
        "seed": config.train.seed,
    }
    if data.source == "converted":
        manifest, _ = ColumnarManifest.load(paths[0])
        features = manifest.sparse_features
        require_features(
            src, f"converted {manifest.kind} data", features, rows, exact=manifest.kind != "movielens"
        )
        _check_dense(src, "converted data", len(manifest.dense_features), config.model.dense_in_features)
        return ColumnarConfig(
            format="converted",
            table_rows=[rows[f] for f in features],
            label_threshold=data.threshold if manifest.label == "rating" else None,
            **common,
        )
    columns = list(data.sparse_columns) or list(rows)
    require_features(src, "data.sparse_columns", columns, rows, exact=True)
    _check_dense(src, "data.dense_columns", len(data.dense_columns), config.model.dense_in_features)
    return ColumnarConfig(
        format="parquet",
        label_column=data.label_column,
        dense_columns=list(data.dense_columns),
        sparse_columns=columns,
        table_rows=[rows[c] for c in columns],
        **common,
    )


def _check_dense(source: str, what: str, have: int, model_wants: int) -> None:
    if have != model_wants:
        raise ConfigError(
            f"{source}: model.dense_in_features is {model_wants} but {what} give {have} dense values "
            "per example"
        )
