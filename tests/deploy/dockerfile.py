"""A reader for the Dockerfile and .dockerignore, enough to check them without Docker.

``read_dockerfile`` splits the file into stages (``FROM ... AS name``) of ``(INSTRUCTION, arguments)`` pairs,
joining ``\\`` continuation lines and dropping comments, as BuildKit does. ``DockerIgnore`` applies the
.dockerignore rules the way Docker does: patterns in order, the last one that matches a path or one of its
parent directories decides, ``!`` re-includes, ``*`` stays within one path segment and ``**`` spans several.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]

    def last(self, keyword: str) -> str | None:
        found = self.all(keyword)
        return found[-1] if found else None


@dataclass
class Dockerfile:
    global_args: dict[str, str]
    stages: list[Stage]

    def stage(self, name: str) -> Stage:
        for stage in self.stages:
            if stage.name == name:
                return stage
        raise AssertionError(f"Dockerfile has no stage {name!r}; stages: {[s.name for s in self.stages]}")

    def lineage(self, name: str) -> list[Stage]:
        """The stage and the stages it is built FROM, nearest first."""
        chain = [self.stage(name)]
        names = {s.name for s in self.stages}
        while chain[-1].base in names:
            chain.append(self.stage(chain[-1].base))
        return chain

    def inherited(self, name: str, keyword: str) -> str | None:
        """The value of ``keyword`` (USER, ENTRYPOINT, ...) in effect in stage ``name``."""
        for stage in self.lineage(name):
            value = stage.last(keyword)
            if value is not None:
                return value
        return None


def logical_lines(text: str) -> list[str]:
    lines, pending = [], ""
    for raw in text.splitlines():
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue  # comment lines inside a continued instruction are dropped
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    assert not pending, "Dockerfile ends inside a continued line"
    return lines


def read_dockerfile(path: Path) -> Dockerfile:
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for line in logical_lines(path.read_text()):
        keyword, _, args = line.partition(" ")
        keyword, args = keyword.upper(), args.strip()
        if keyword == "FROM":
            match = re.fullmatch(r"(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?", args, re.IGNORECASE)
            assert match, f"cannot read FROM {args!r}"
            base, name = match.group(1), match.group(2) or str(len(stages))
            stages.append(Stage(name=name, base=expand_args(base, global_args)))
        elif keyword == "ARG" and not stages:
            key, _, default = args.partition("=")
            global_args[key] = default
        else:
            assert stages, f"{keyword} before the first FROM"
            stages[-1].instructions.append((keyword, args))
    return Dockerfile(global_args, stages)


def expand_args(text: str, values: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: values.get(m.group(1) or m.group(2), m.group(0)), text)


def exec_form(args: str, where: str) -> list[str]:
    """The JSON list of an exec-form ENTRYPOINT/CMD (shell form would not get signals as PID 1)."""
    try:
        value = json.loads(args)
    except json.JSONDecodeError:
        raise AssertionError(f"{where} is not in exec form (a JSON list): {args}") from None
    assert isinstance(value, list) and all(isinstance(v, str) for v in value), f"{where}: {args}"
    return value


def healthcheck_command(args: str) -> list[str]:
    """The command of ``HEALTHCHECK [--options] CMD [...]``."""
    options, sep, command = args.partition("CMD ")
    assert sep, f"HEALTHCHECK without CMD: {args}"
    assert all(o.startswith("--") for o in options.split()), f"HEALTHCHECK options: {options}"
    return exec_form(command.strip(), "HEALTHCHECK CMD")


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**", i):
            out.append(".*")
            i += 2
            if pattern.startswith("/", i):
                out[-1] = "(?:.*/)?"
                i += 1
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))


class DockerIgnore:
    def __init__(self, path: Path) -> None:
        self.rules: list[tuple[bool, re.Pattern[str]]] = []
        self._included: list[str] = []  # the ! patterns
        for raw in path.read_text().splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            negated = line.startswith("!")
            pattern = line.lstrip("!").strip().strip("/")
            self.rules.append((negated, _pattern_regex(pattern)))
            if negated:
                self._included.append(pattern)

    def excluded(self, path: str) -> bool:
        """Whether ``path`` (relative to the context, with ``/``) stays out of the build context."""
        parts = path.strip("/").split("/")
        candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        excluded = False
        for negated, regex in self.rules:
            if any(regex.fullmatch(c) for c in candidates):
                excluded = not negated
        return excluded

    def context_files(self, root: Path) -> list[str]:
        """The files under ``root`` that Docker sends as the build context (relative paths)."""
        found = []
        for directory, subdirs, files in os.walk(root):
            rel = Path(directory).relative_to(root).as_posix()
            rel = "" if rel == "." else rel + "/"
            # Prune excluded directories that no ! pattern reaches into (.git, .venv, ...).
            subdirs[:] = [d for d in subdirs if not self._prunable(rel + d)]
            found += [rel + f for f in files if not self.excluded(rel + f)]
        return sorted(found)

    def _prunable(self, directory: str) -> bool:
        reachable = any(p.startswith(directory + "/") or p.startswith("*") for p in self._included)
        return self.excluded(directory) and not reachable
