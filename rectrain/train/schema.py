"""Read a TOML table into a config dataclass, checking every key and type against the dataclass's fields.

A field's annotation gives its type (``int``, ``float``, ``bool``, ``str``, ``list[str]``, ``list[int]``,
optionally ``| None``); ``field(metadata=...)`` adds a bound (``minimum``, exclusive ``above``) or the allowed
``choices``. Errors name the file, the key path and what was expected:

    run.toml: train.batch_size: expected a positive int, got 'abc'
    run.toml: train.bach_size: unknown key (did you mean 'batch_size'?); known keys: batch_size, epochs, ...
"""

from __future__ import annotations

import dataclasses
import difflib
import sys
import types
import typing
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from rectrain.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # Python 3.10: the same parser, from PyPI
    import tomli as tomllib

T = TypeVar("T")

_SCALARS = {int: "an int", float: "a number", bool: "a bool (true or false)", str: "a string"}


def positive(**extra: Any) -> dict[str, Any]:
    """Field metadata: the value must be >= 1 (ints) or > 0 (numbers)."""
    return {"above": 0, **extra}


def non_negative(**extra: Any) -> dict[str, Any]:
    """Field metadata: the value must be >= 0."""
    return {"minimum": 0, **extra}


def choices(*allowed: str) -> dict[str, Any]:
    """Field metadata: the value must be one of ``allowed``."""
    return {"choices": allowed}


def unknown_key_message(key: str, known: Iterable[str]) -> str:
    """``unknown key (did you mean 'x'?); known keys: ...`` for a key that is not a field."""
    known = sorted(known)
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"unknown key{hint}; known keys: {', '.join(known)}"


def _unwrap(annotation: Any) -> tuple[Any, bool]:
    """(the type without ``None``, whether ``None`` is allowed)."""
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"unsupported config annotation {annotation}")
        return args[0], True
    return annotation, False


def _expected(kind: Any, meta: Mapping[str, Any]) -> str:
    if "choices" in meta:
        return "one of " + ", ".join(repr(c) for c in meta["choices"])
    if typing.get_origin(kind) is list:
        (item,) = typing.get_args(kind)
        return f"a list of {_SCALARS[item].split(' ', 1)[1]}s"
    text = _SCALARS[kind]
    if "above" in meta and meta["above"] == 0:
        return f"a positive {text.split(' ', 1)[1]}"
    if "minimum" in meta and meta["minimum"] == 0:
        return f"a non-negative {text.split(' ', 1)[1]}"
    return text


def _is(value: Any, kind: Any) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, kind) and not isinstance(value, bool)


def _valid(value: Any, kind: Any, meta: Mapping[str, Any]) -> bool:
    if typing.get_origin(kind) is list:
        (item,) = typing.get_args(kind)
        return isinstance(value, list) and all(_is(v, item) for v in value)
    if not _is(value, kind):
        return False
    if "choices" in meta and value not in meta["choices"]:
        return False
    if "above" in meta and not value > meta["above"]:
        return False
    return not ("minimum" in meta and value < meta["minimum"])


def read_section(cls: type[T], table: Any, *, where: str, source: str) -> T:
    """``cls(**table)`` after checking keys and value types; ``where`` is the key path (``"train"``)."""
    if not isinstance(table, dict):
        raise ConfigError(f"{source}: {where}: expected a table, got {table!r}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    hints = typing.get_type_hints(cls)
    for key in table:
        if key not in fields:
            raise ConfigError(f"{source}: {where}.{key}: {unknown_key_message(key, fields)}")
    values = {}
    for name, value in table.items():
        kind, optional = _unwrap(hints[name])
        meta = fields[name].metadata
        if not (optional and value is None) and not _valid(value, kind, meta):
            raise ConfigError(f"{source}: {where}.{name}: expected {_expected(kind, meta)}, got {value!r}")
        values[name] = float(value) if kind is float else value
    return cls(**values)


def load_toml(path: Path) -> dict[str, Any]:
    """The parsed TOML document at ``path``; ``ConfigError`` when it is missing or not valid TOML."""
    if path.is_dir():
        example = path / "run.toml"
        raise ConfigError(f"config file {path} is a directory; give the run's TOML file, e.g. {example}")
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} does not exist; check the --config path") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"config file {path} cannot be read: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path.name}: not valid TOML: {e}") from None


def parse_override(assignment: str, *, source: str = "--set") -> tuple[list[str], Any]:
    """``"train.steps=50"`` -> (["train", "steps"], 50); the value is read as TOML, else as a bare string."""
    key, sep, raw = assignment.partition("=")
    path = [part.strip() for part in key.split(".")]
    if not sep or not all(path):
        raise ConfigError(f"{source} {assignment!r}: expected section.key=value, e.g. train.steps=50")
    try:
        value = tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw  # a bare word such as data.source=criteo
    return path, value


def apply_overrides(raw: dict[str, Any], assignments: Iterable[str]) -> dict[str, Any]:
    """A copy of ``raw`` with every ``section.key=value`` assignment set (creating tables on the way)."""
    result = _deep_copy(raw)
    for assignment in assignments:
        path, value = parse_override(assignment)
        table = result
        for i, part in enumerate(path[:-1]):
            table = table.setdefault(part, {})
            if not isinstance(table, dict):
                where = ".".join(path[: i + 1])
                raise ConfigError(f"--set {assignment!r}: {where} is a value, not a table")
        table[path[-1]] = value
        # A run's length is steps or epochs: overriding one replaces the other the file set, so
        # `--set train.steps=50` works on a config that says `epochs = 1` (and the reverse).
        rival = _EXCLUSIVE.get(tuple(path))
        if rival is not None:
            table.pop(rival, None)
    return result


# Keys of which a config gives at most one; an override of one drops the other.
_EXCLUSIVE = {("train", "steps"): "epochs", ("train", "epochs"): "steps"}


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _deep_copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_deep_copy(v) for v in value]
    return value
