"""``ModelConfig``: which architecture to build, its tables and layer sizes, as one JSON/TOML-able dataclass.

``ModelConfig.from_dict(d, where)`` is the one parser of user configs (TOML ``[model]`` tables, checkpoint and
package manifests); every error names the key path and the expected type or value, e.g.
``model.tables[2].embedding_dim: expected int, got 'x'``. ``to_dict`` writes the same layout back, so
``from_dict(cfg.to_dict()) == cfg``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rectrain.embedding import DataType, EmbeddingBagConfig, PoolingType
from rectrain.embedding.layout import get_embedding_names_by_table
from rectrain.errors import ConfigError

MODEL_KINDS = ("dlrm", "dlrm_dcn", "two_tower")
_TABLE_KEYS = {
    "name": str,
    "num_embeddings": int,
    "embedding_dim": int,
    "feature_names": list,
    "pooling": str,
    "data_type": str,
    "weight_init_max": float,
    "weight_init_min": float,
    # Where the table trains (rectrain.embedding.disk_tables): "ram" (default) or "disk". A placement, like
    # sharding: it is not written back by to_dict, so a model's identity (checkpoint, package) is the same.
    "storage": str,
}
_REQUIRED_TABLE_KEYS = ("name", "num_embeddings", "embedding_dim")


@dataclass
class ModelConfig:
    """The architecture of a recommendation model (see ``rectrain.models.build_model``).

    Args:
        kind: ``"dlrm"`` (dot interaction), ``"dlrm_dcn"`` (DCN-v2 low-rank cross net) or ``"two_tower"``.
        tables: the embedding tables (one ``EmbeddingBagCollection``).
        dense_in_features: width of the dense input; 0 for ``two_tower`` (which reads no dense features).
        dense_arch_layer_sizes: DLRM bottom MLP; the last size equals the tables' embedding_dim.
        over_arch_layer_sizes: DLRM top MLP; the last size is 1 (one logit per example).
        dcn_num_layers, dcn_low_rank_dim: the cross net of ``dlrm_dcn``.
        query_features, candidate_features: ``two_tower``'s feature (embedding) names per tower; both empty
            means TorchRec's convention: the first table's features and the second table's.
        tower_layer_sizes: ``two_tower``'s MLP sizes, the same for both towers.
    """

    kind: str
    tables: list[EmbeddingBagConfig]
    dense_in_features: int
    dense_arch_layer_sizes: list[int] = field(default_factory=list)
    over_arch_layer_sizes: list[int] = field(default_factory=list)
    dcn_num_layers: int = 3
    dcn_low_rank_dim: int = 64
    query_features: list[str] = field(default_factory=list)
    candidate_features: list[str] = field(default_factory=list)
    tower_layer_sizes: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self, where: str = "model") -> None:
        """Raise ``ConfigError`` (message prefixed by the key path ``where``) if the fields do not fit."""
        if self.kind not in MODEL_KINDS:
            raise ConfigError(f"{where}.kind: expected one of {list(MODEL_KINDS)}, got {self.kind!r}")
        _check_tables(self.tables, f"{where}.tables")
        if self.kind == "two_tower":
            self._validate_two_tower(where)
        else:
            self._validate_dlrm(where)

    def _validate_dlrm(self, where: str) -> None:
        _check_int(self.dense_in_features, f"{where}.dense_in_features", minimum=1)
        dense = _check_sizes(self.dense_arch_layer_sizes, f"{where}.dense_arch_layer_sizes")
        over = _check_sizes(self.over_arch_layer_sizes, f"{where}.over_arch_layer_sizes")
        dims = sorted({t.embedding_dim for t in self.tables})
        if len(dims) != 1:
            raise ConfigError(
                f"{where}.tables: {self.kind} needs one embedding_dim for all tables, got {dims}"
            )
        if dense[-1] != dims[0]:
            raise ConfigError(
                f"{where}.dense_arch_layer_sizes[-1]: expected the tables' embedding_dim {dims[0]}, "
                f"got {dense[-1]}"
            )
        if over[-1] != 1:
            raise ConfigError(f"{where}.over_arch_layer_sizes[-1]: expected 1 (one logit), got {over[-1]}")
        if self.kind == "dlrm_dcn":
            _check_int(self.dcn_num_layers, f"{where}.dcn_num_layers", minimum=1)
            _check_int(self.dcn_low_rank_dim, f"{where}.dcn_low_rank_dim", minimum=1)

    def _validate_two_tower(self, where: str) -> None:
        if self.dense_in_features != 0:
            raise ConfigError(
                f"{where}.dense_in_features: two_tower reads no dense features, expected 0, "
                f"got {self.dense_in_features!r}"
            )
        _check_sizes(self.tower_layer_sizes, f"{where}.tower_layer_sizes")
        query, candidate = self.tower_features(where)
        names = [n for table in get_embedding_names_by_table(self.tables) for n in table]
        for key, features in (("query_features", query), ("candidate_features", candidate)):
            if not features:
                raise ConfigError(f"{where}.{key}: expected at least one feature name, got []")
            for position, name in enumerate(features):
                if name not in names:
                    raise ConfigError(
                        f"{where}.{key}[{position}]: {name!r} is not a feature of any table; "
                        f"features are {names}"
                    )
        shared = sorted(set(query) & set(candidate))
        if shared:
            raise ConfigError(f"{where}.query_features and candidate_features share {shared}")

    def tower_features(self, where: str = "model") -> tuple[list[str], list[str]]:
        """``two_tower``'s (query, candidate) feature names, with TorchRec's default when none are given."""
        if self.query_features or self.candidate_features:
            return list(self.query_features), list(self.candidate_features)
        if len(self.tables) != 2:
            raise ConfigError(
                f"{where}.query_features / candidate_features: give them, or exactly 2 tables (query, "
                f"candidate) to default to; got {len(self.tables)} tables"
            )
        names = get_embedding_names_by_table(self.tables)
        return list(names[0]), list(names[1])

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict in the layout ``from_dict`` reads."""
        return {
            "kind": self.kind,
            "tables": [_table_to_dict(t) for t in self.tables],
            "dense_in_features": self.dense_in_features,
            "dense_arch_layer_sizes": list(self.dense_arch_layer_sizes),
            "over_arch_layer_sizes": list(self.over_arch_layer_sizes),
            "dcn_num_layers": self.dcn_num_layers,
            "dcn_low_rank_dim": self.dcn_low_rank_dim,
            "query_features": list(self.query_features),
            "candidate_features": list(self.candidate_features),
            "tower_layer_sizes": list(self.tower_layer_sizes),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str = "model") -> ModelConfig:
        """Parse ``d`` (a TOML table or JSON object); errors name the key path under ``where``."""
        if not isinstance(d, dict):
            raise ConfigError(f"{where}: expected a table (dict), got {type(d).__name__}")
        _check_keys(d, _FIELD_TYPES, ("kind", "tables", "dense_in_features"), where)
        kwargs: dict[str, Any] = {}
        for key, value in d.items():
            path = f"{where}.{key}"
            if key == "tables":
                if not isinstance(value, list):
                    raise ConfigError(f"{path}: expected a list of tables, got {type(value).__name__}")
                kwargs[key] = [_table_from_dict(t, f"{path}[{i}]") for i, t in enumerate(value)]
            elif _FIELD_TYPES[key] is list:
                kwargs[key] = _check_list(value, path, _LIST_ITEM_TYPES[key])
            else:
                kwargs[key] = _check_type(value, path, _FIELD_TYPES[key])
        # Build without __post_init__ so that validation errors carry ``where`` rather than "model".
        cfg = cls.__new__(cls)
        for name, default in _DEFAULTS.items():
            setattr(cfg, name, kwargs.get(name, default() if callable(default) else default))
        cfg.validate(where)
        return cfg


_FIELD_TYPES: dict[str, type] = {
    "kind": str,
    "tables": list,
    "dense_in_features": int,
    "dense_arch_layer_sizes": list,
    "over_arch_layer_sizes": list,
    "dcn_num_layers": int,
    "dcn_low_rank_dim": int,
    "query_features": list,
    "candidate_features": list,
    "tower_layer_sizes": list,
}
_LIST_ITEM_TYPES: dict[str, type] = {
    "dense_arch_layer_sizes": int,
    "over_arch_layer_sizes": int,
    "query_features": str,
    "candidate_features": str,
    "tower_layer_sizes": int,
}
_DEFAULTS: dict[str, Any] = {
    "kind": None,
    "tables": None,
    "dense_in_features": None,
    "dense_arch_layer_sizes": list,
    "over_arch_layer_sizes": list,
    "dcn_num_layers": 3,
    "dcn_low_rank_dim": 64,
    "query_features": list,
    "candidate_features": list,
    "tower_layer_sizes": list,
}


def _type_name(value: Any) -> str:
    return repr(value) if isinstance(value, str) else type(value).__name__


def _check_type(value: Any, path: str, expected: type) -> Any:
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) or not isinstance(value, expected):
        raise ConfigError(f"{path}: expected {expected.__name__}, got {_type_name(value)}")
    return value


def _check_list(value: Any, path: str, item_type: type) -> list:
    if not isinstance(value, list):
        raise ConfigError(f"{path}: expected a list of {item_type.__name__}, got {_type_name(value)}")
    return [_check_type(item, f"{path}[{i}]", item_type) for i, item in enumerate(value)]


def _check_keys(d: dict, known: dict[str, type], required: tuple[str, ...], where: str) -> None:
    for key in d:
        if key not in known:
            raise ConfigError(f"{where}.{key}: unknown key; expected one of {sorted(known)}")
    for key in required:
        if key not in d:
            raise ConfigError(f"{where}.{key}: missing (required)")


def _check_int(value: Any, path: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{path}: expected int, got {_type_name(value)}")
    if value < minimum:
        raise ConfigError(f"{path}: expected an int >= {minimum}, got {value}")


def _check_sizes(sizes: Any, path: str) -> list[int]:
    if not isinstance(sizes, list | tuple) or not sizes:
        raise ConfigError(f"{path}: expected a non-empty list of positive ints, got {sizes!r}")
    for position, size in enumerate(sizes):
        _check_int(size, f"{path}[{position}]", minimum=1)
    return list(sizes)


def _check_tables(tables: Any, path: str) -> None:
    if not isinstance(tables, list | tuple) or not tables:
        raise ConfigError(f"{path}: expected a non-empty list of tables, got {tables!r}")
    seen: set[str] = set()
    for position, table in enumerate(tables):
        if not isinstance(table, EmbeddingBagConfig):
            raise ConfigError(f"{path}[{position}]: expected EmbeddingBagConfig, got {type(table).__name__}")
        if not table.name:
            raise ConfigError(f"{path}[{position}].name: expected a non-empty table name, got ''")
        if table.name in seen:
            raise ConfigError(f"{path}[{position}].name: {table.name!r} is used by an earlier table")
        seen.add(table.name)


def _table_to_dict(table: EmbeddingBagConfig) -> dict[str, Any]:
    d: dict[str, Any] = {
        "name": table.name,
        "num_embeddings": table.num_embeddings,
        "embedding_dim": table.embedding_dim,
        "feature_names": list(table.feature_names),
        "pooling": table.pooling.value,
        "data_type": table.data_type.value,
    }
    if table.weight_init_max is not None:
        d["weight_init_max"] = table.weight_init_max
    if table.weight_init_min is not None:
        d["weight_init_min"] = table.weight_init_min
    return d


def _table_from_dict(d: Any, path: str) -> EmbeddingBagConfig:
    if not isinstance(d, dict):
        raise ConfigError(f"{path}: expected a table (dict), got {_type_name(d)}")
    _check_keys(d, _TABLE_KEYS, _REQUIRED_TABLE_KEYS, path)
    kwargs: dict[str, Any] = {}
    for key, value in d.items():
        if key == "feature_names":
            kwargs[key] = _check_list(value, f"{path}.{key}", str)
        else:
            kwargs[key] = _check_type(value, f"{path}.{key}", _TABLE_KEYS[key])
    for key in ("num_embeddings", "embedding_dim"):
        _check_int(kwargs[key], f"{path}.{key}", minimum=1)
    for key, enum in (("pooling", PoolingType), ("data_type", DataType)):
        if key in kwargs:
            allowed = [m.value for m in enum if m is not PoolingType.NONE]
            if kwargs[key].upper() not in allowed:
                raise ConfigError(f"{path}.{key}: expected one of {allowed}, got {kwargs[key]!r}")
    try:
        return EmbeddingBagConfig(**kwargs)
    except ConfigError as e:
        raise ConfigError(f"{path}: {e}") from None
