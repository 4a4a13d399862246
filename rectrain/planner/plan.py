"""The sharding plan: which table goes where, as a hand-editable, validated JSON document.

Format (``format_version`` 1)::

    {"format_version": 1, "world_size": 2, "local_world_size": 2,
     "modules": {"<module path>": {"<table>": {
        "sharding_type": "table_wise", "compute_kernel": "fused",
        "num_embeddings": 100000, "embedding_dim": 64, "ranks": [1],
        "shards": [{"row_offset": 0, "num_rows": 100000, "col_offset": 0, "num_cols": 64,
                    "rank": 1, "storage": 26214400, "perf": 0.0012}]}}}}

``storage`` (bytes) and ``perf`` (seconds) are the planner's estimates and may be omitted. Keys are sorted,
so the same plan always serialises to the same text.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rectrain.durable import write_text_atomic
from rectrain.errors import ConfigError
from rectrain.planner.report import format_report
from rectrain.planner.types import ParameterSharding, Shard, ShardingType
from rectrain.planner.validate import validate_sharding

FORMAT_VERSION = 1
_SHARD_FIELDS = ("row_offset", "num_rows", "col_offset", "num_cols", "rank", "storage", "perf")

ModulePlan = dict[str, ParameterSharding]


@dataclass
class ShardingPlan:
    """``plan[module_path][table_name] -> ParameterSharding`` (``torchrec.distributed.types.ShardingPlan``).

    ``table_shapes[module_path][table_name]`` is ``(num_embeddings, embedding_dim)``; the plan is validated
    against it on construction, so a plan that exists covers every table exactly once. ``ShardingPlan({})``
    (TorchRec's form) is the empty plan of one rank.
    """

    plan: dict[str, ModulePlan]
    world_size: int = 1
    table_shapes: dict[str, dict[str, tuple[int, int]]] = field(default_factory=dict)
    local_world_size: int | None = None
    format_version: int = field(default=FORMAT_VERSION)

    def __post_init__(self) -> None:
        if self.local_world_size is None:
            self.local_world_size = self.world_size
        if self.format_version != FORMAT_VERSION:
            raise ConfigError(
                f"plan format_version {self.format_version} is not supported "
                f"(this rectrain reads {FORMAT_VERSION})"
            )
        if not isinstance(self.world_size, int) or self.world_size <= 0:
            raise ConfigError(f"plan world_size must be a positive int, got {self.world_size!r}")
        if not isinstance(self.local_world_size, int) or self.world_size % max(self.local_world_size, 1):
            raise ConfigError(
                f"plan local_world_size ({self.local_world_size!r}) must divide "
                f"world_size ({self.world_size})"
            )
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ConfigError` naming the table and field of the first malformed entry."""
        for module_path, tables in self.plan.items():
            for name, sharding in tables.items():
                shape = self.table_shapes.get(module_path, {}).get(name)
                if shape is None:
                    raise ConfigError(
                        f"plan {module_path}.{name}: num_embeddings and embedding_dim are missing"
                    )
                validate_sharding(
                    f"{module_path}.{name}", sharding, shape, self.world_size, self.local_world_size
                )

    def get_plan_for_module(self, module_path: str) -> ModulePlan | None:
        """The tables of ``module_path`` and their sharding, or None if the module has none (TorchRec API)."""
        return self.plan.get(module_path)

    def override(self, module_path: str, table: str, sharding: ParameterSharding) -> None:
        """Replace one table's sharding (validated against the table's shape); the rest stays as planned."""
        shape = self.table_shapes.get(module_path, {}).get(table)
        if shape is None:
            known = sorted(f"{m}.{t}" for m, ts in self.plan.items() for t in ts)
            raise ConfigError(f"plan has no table {module_path}.{table}; it has {known}")
        if sharding.ranks is None and sharding.sharding_spec is not None:
            if sharding.sharding_type == ShardingType.DATA_PARALLEL:
                ranks = list(range(self.world_size))
            else:
                ranks = [s.rank for s in sharding.sharding_spec]
            sharding = dataclasses.replace(sharding, ranks=ranks)
        validate_sharding(f"{module_path}.{table}", sharding, shape, self.world_size, self.local_world_size)
        self.plan[module_path][table] = sharding

    def to_dict(self) -> dict[str, Any]:
        modules = {
            module_path: {
                name: _sharding_to_dict(sharding, self.table_shapes[module_path][name])
                for name, sharding in tables.items()
            }
            for module_path, tables in self.plan.items()
        }
        return {
            "format_version": self.format_version,
            "world_size": self.world_size,
            "local_world_size": self.local_world_size,
            "modules": modules,
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ShardingPlan:
        for key in ("format_version", "world_size", "modules"):
            if key not in data:
                raise ConfigError(f"plan is missing the field {key!r}")
        plan: dict[str, ModulePlan] = {}
        shapes: dict[str, dict[str, tuple[int, int]]] = {}
        for module_path, tables in sorted(data["modules"].items()):
            plan[module_path], shapes[module_path] = {}, {}
            for name, entry in sorted(tables.items()):
                where = f"{module_path}.{name}"
                plan[module_path][name] = _sharding_from_dict(where, entry)
                shapes[module_path][name] = (
                    _field(where, entry, "num_embeddings"),
                    _field(where, entry, "embedding_dim"),
                )
        return cls(
            plan=plan,
            world_size=data["world_size"],
            table_shapes=shapes,
            local_world_size=data.get("local_world_size"),
            format_version=data["format_version"],
        )

    @classmethod
    def from_json(cls, text: str) -> ShardingPlan:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"plan is not valid JSON: {e}") from None
        if not isinstance(data, dict):
            raise ConfigError("plan JSON must be an object")
        return cls.from_dict(data)

    def save(self, path: str | os.PathLike) -> None:
        """Write the JSON atomically (temp file, fsync, rename)."""
        write_text_atomic(Path(path), self.to_json() + "\n")

    @classmethod
    def load(cls, path: str | os.PathLike) -> ShardingPlan:
        return cls.from_json(Path(path).read_text())

    def report(self) -> str:
        """Fixed-width table: per rank the shards, bytes and estimated seconds, then the imbalance."""
        return format_report(self)

    def __str__(self) -> str:
        return self.report()


def _sharding_to_dict(sharding: ParameterSharding, shape: tuple[int, int]) -> dict[str, Any]:
    shards = [
        {k: getattr(s, k) for k in _SHARD_FIELDS if getattr(s, k) is not None or k == "rank"}
        for s in sharding.sharding_spec
    ]
    return {
        "sharding_type": sharding.sharding_type.value,
        "compute_kernel": sharding.compute_kernel.value,
        "num_embeddings": shape[0],
        "embedding_dim": shape[1],
        "ranks": sharding.ranks,
        "shards": shards,
    }


def _sharding_from_dict(where: str, entry: Any) -> ParameterSharding:
    if not isinstance(entry, dict):
        raise ConfigError(f"plan {where}: expected an object, got {type(entry).__name__}")
    shards = []
    for i, raw in enumerate(_field(where, entry, "shards", list)):
        if not isinstance(raw, dict):
            raise ConfigError(f"plan {where}: shards[{i}] must be an object")
        unknown = sorted(set(raw) - set(_SHARD_FIELDS))
        if unknown:
            raise ConfigError(
                f"plan {where}: shards[{i}] has unknown fields {unknown}; known: {list(_SHARD_FIELDS)}"
            )
        missing = [k for k in _SHARD_FIELDS[:4] if k not in raw]
        if missing:
            raise ConfigError(f"plan {where}: shards[{i}] is missing {missing}")
        shards.append(Shard(**raw))
    try:
        return ParameterSharding(
            sharding_type=_field(where, entry, "sharding_type"),
            compute_kernel=_field(where, entry, "compute_kernel"),
            ranks=entry.get("ranks"),
            sharding_spec=shards,
        )
    except ConfigError as e:
        raise ConfigError(f"plan {where}: {e}") from None


def _field(where: str, entry: dict[str, Any], key: str, kind: type | None = None) -> Any:
    if key not in entry:
        raise ConfigError(f"plan {where}: missing field {key!r}")
    if kind is not None and not isinstance(entry[key], kind):
        raise ConfigError(f"plan {where}: field {key!r} must be a {kind.__name__}")
    return entry[key]
