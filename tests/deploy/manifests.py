"""Loading deploy/'s manifests and checking command lines against the product's real argparse parsers."""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
_VAR = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


def yaml_files() -> list[Path]:
    return sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yaml", ".yml"))


def json_files() -> list[Path]:
    return sorted(DEPLOY.rglob("*.json"))


def load_yaml(path: Path) -> list[Any]:
    """Every document of a YAML file (empty documents dropped)."""
    with path.open() as f:
        return [doc for doc in yaml.safe_load_all(f) if doc is not None]


def load_json(path: Path) -> Any:
    return json.loads(path.read_text())


def k8s_objects() -> list[tuple[Path, dict[str, Any]]]:
    return [(path, doc) for path in sorted(K8S.glob("*.yaml")) for doc in load_yaml(path)]


def k8s_object(kind: str, name: str) -> dict[str, Any]:
    found = [doc for _, doc in k8s_objects() if doc["kind"] == kind and doc["metadata"]["name"] == name]
    assert len(found) == 1, f"expected one {kind} {name!r} in deploy/k8s, found {len(found)}"
    return found[0]


def pod_spec(workload: dict[str, Any]) -> dict[str, Any]:
    return workload["spec"]["template"]["spec"]


def workloads() -> Iterator[tuple[str, dict[str, Any]]]:
    """(``Kind/name``, object) for every object of deploy/k8s that runs pods."""
    for _, doc in k8s_objects():
        if doc["kind"] in ("Job", "Deployment", "StatefulSet", "DaemonSet"):
            yield f"{doc['kind']}/{doc['metadata']['name']}", doc


def container_argv(container: dict[str, Any], where: str) -> list[str]:
    """``command + args`` with ``$(VAR)`` expanded as the kubelet does from the container's ``env``.

    A ``valueFrom`` variable becomes ``<VAR>``; a reference to a variable the container does not define is an
    error (Kubernetes would pass it through literally).
    """
    env: dict[str, str] = {}
    for var in container.get("env", []):
        env[var["name"]] = str(var["value"]) if "value" in var else f"<{var['name']}>"

    def expand(token: str) -> str:
        def one(match: re.Match[str]) -> str:
            name = match.group(1)
            assert name in env, f"{where}: $({name}) in {token!r} is not in the container's env {sorted(env)}"
            return env[name]

        return _VAR.sub(one, token)

    argv = [*container.get("command", []), *container.get("args", [])]
    assert all(isinstance(t, str) for t in argv), (
        f"{where}: every command/args entry must be a string: {argv}"
    )
    return [expand(token) for token in argv]


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def command_tree(parser: argparse.ArgumentParser, prefix: str = "") -> dict[str, set[str]]:
    """``{"serve": {"--port", ...}, ...}``: every (sub)command path and its option strings."""
    tree = {prefix.strip(): {o for a in parser._actions for o in a.option_strings}}
    for name, sub in _subparsers(parser).items():
        tree.update(command_tree(sub, f"{prefix} {name}"))
    return tree


def check_flags(parser: argparse.ArgumentParser, argv: list[str], where: str) -> None:
    """Every ``--flag`` in ``argv`` is spelled out in full by the (sub)command it follows.

    argparse alone would accept unambiguous prefixes, which break silently when a longer flag is added.
    """
    tree = command_tree(parser)
    path, options = "", set(tree[""])
    for token in argv:
        if token.startswith("-") and len(token) > 1 and not token[1].isdigit():
            flag = token.split("=", 1)[0]
            depth = len(path.split()) + 1
            subcommands = sorted(
                k.split()[-1] for k in tree if len(k.split()) == depth and k.startswith(path.strip())
            )
            assert flag in options, (
                f"{where}: `{parser.prog}{path} ... {flag}` is not a flag of the real CLI; "
                f"`{parser.prog}{path}` has {sorted(options)}"
                + (f" and subcommands {subcommands}" if subcommands else "")
            )
        elif f"{path} {token}".strip() in tree:
            path = f"{path} {token}"
            options |= tree[path.strip()]


def parse_command(parser: argparse.ArgumentParser, argv: list[str], where: str) -> argparse.Namespace:
    """Parses ``argv`` with the real parser; fails naming the manifest if argparse rejects it."""
    err, out = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            return parser.parse_args(argv)
    except SystemExit as e:
        if e.code == 0 and ("--help" in argv or "-h" in argv):
            return argparse.Namespace(help=True)
        command = f"{parser.prog} {' '.join(argv)}"
        raise AssertionError(
            f"{where}: `{command}` is rejected by the real parser: {err.getvalue().strip()}"
        ) from None


def real_parser(program: str) -> argparse.ArgumentParser:
    """``rectrain.cli.build_parser()`` / ``recserve.cli.build_parser()`` / torchrun's own parser."""
    if program == "torchrun":
        from torch.distributed.run import get_args_parser

        return get_args_parser()
    try:
        module = __import__(f"{program}.cli", fromlist=["build_parser"])
        build = module.build_parser
    except (ImportError, AttributeError) as e:
        raise AssertionError(
            f"deploy/ runs `{program} ...` but {program}.cli.build_parser() is not available ({e}); "
            "the manifests cannot be checked until it exists"
        ) from None
    return build()


def volume_for(pod: dict[str, Any], container: dict[str, Any], path: str) -> tuple[dict[str, Any], str]:
    """(the pod volume mounted at the deepest mount containing ``path``, ``path`` relative to that mount)."""
    best = None
    for mount in container.get("volumeMounts", []):
        root = mount["mountPath"].rstrip("/")
        if (path == root or path.startswith(root + "/")) and (best is None or len(root) > len(best[0])):
            best = (root, mount)
    assert best is not None, f"{path} is on no volume of container {container['name']}"
    root, mount = best
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    return volume, path[len(root) :].lstrip("/")


def container_port(container: dict[str, Any], name: str) -> int:
    ports = {p.get("name"): p["containerPort"] for p in container.get("ports", [])}
    assert name in ports, f"container {container['name']} has no port named {name!r}: {ports}"
    return ports[name]


@dataclass
class Command:
    """A command line of deploy/, parsed by the real parsers."""

    program: str  # "rectrain" or "recserve"
    args: argparse.Namespace
    launcher: argparse.Namespace | None = None  # torchrun's own arguments, when launched by torchrun


def read_command(argv: list[str], where: str) -> Command:
    """Parses ``rectrain ...``, ``recserve ...`` or ``torchrun [opts] -m rectrain ...`` (both levels)."""
    assert argv, f"{where}: empty command"
    program = argv[0]
    if program == "torchrun":
        torchrun = real_parser("torchrun")
        launcher = parse_command(torchrun, argv[1:], where)
        script_at = len(argv) - 1 - len(launcher.training_script_args)
        check_flags(torchrun, argv[1:script_at], where)
        assert launcher.module and launcher.training_script in ("rectrain", "recserve"), (
            f"{where}: torchrun should run `-m rectrain`, got script {launcher.training_script!r}"
        )
        inner = read_command([launcher.training_script, *launcher.training_script_args], where)
        return Command(inner.program, inner.args, launcher)
    assert program in ("rectrain", "recserve"), f"{where}: runs {program!r}, not rectrain/recserve/torchrun"
    parser = real_parser(program)
    check_flags(parser, argv[1:], where)
    return Command(program, parse_command(parser, argv[1:], where))


def with_env(container: dict[str, Any], **values: str) -> dict[str, Any]:
    """A copy of ``container`` with the ``value`` of some env variables changed."""
    env = [dict(var, value=values[var["name"]]) if var["name"] in values else var for var in container["env"]]
    return {**container, "env": env}


def localize(argv: list[str], pod: dict[str, Any], container: dict[str, Any], root: Path) -> list[str]:
    """``argv`` with paths on the pod's volumes moved under ``root``, as if the volumes were local dirs.

    A PersistentVolumeClaim becomes ``root/<claim name>`` (shared by every workload that mounts the claim,
    as on a cluster) and a ConfigMap ``root/<config map name>`` holding its files.
    """
    mounts = sorted(container.get("volumeMounts", []), key=lambda m: -len(m["mountPath"]))
    out = []
    for token in argv:
        for mount in mounts:
            base = mount["mountPath"].rstrip("/")
            if token == base or token.startswith(base + "/"):
                (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
                token = str(_volume_dir(volume, root)) + token[len(base) :]
                break
        out.append(token)
    return out


def _volume_dir(volume: dict[str, Any], root: Path) -> Path:
    if "persistentVolumeClaim" in volume:
        directory = root / volume["persistentVolumeClaim"]["claimName"]
    elif "configMap" in volume:
        name = volume["configMap"]["name"]
        directory = root / name
        directory.mkdir(parents=True, exist_ok=True)
        for key, text in k8s_object("ConfigMap", name)["data"].items():
            (directory / key).write_text(text)
    else:
        directory = root / volume["name"]
    directory.mkdir(parents=True, exist_ok=True)
    return directory
