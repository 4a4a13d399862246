"""Build a serving model from its architecture config: the training builder's dense part around quantized
lookups.

``rectrain.models.build_model`` makes the prediction module; its one ``EmbeddingBagCollection`` is built with
1-row placeholder tables (so no fp32 tables are allocated) and then replaced by a
``QuantEmbeddingBagCollection``. Export uses the same helpers to tell table weights from dense parameters.
"""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

from recserve.errors import PackageError
from rectrain.embedding import EmbeddingBagCollection
from rectrain.models import build_model
from rectrain.models.config import ModelConfig


def find_embedding_bag_collection(model: nn.Module) -> str:
    """The module path of the one ``EmbeddingBagCollection`` in ``model``."""
    paths = [name for name, module in model.named_modules() if isinstance(module, EmbeddingBagCollection)]
    if len(paths) != 1:
        raise PackageError(
            f"the model must hold exactly one EmbeddingBagCollection, found {len(paths)}: {paths}"
        )
    return paths[0]


def table_weight_key(ebc_path: str, table: str) -> str:
    """The prediction module's state-dict key of ``table``'s weight."""
    prefix = f"{ebc_path}." if ebc_path else ""
    return f"{prefix}embedding_bags.{table}.weight"


def build_skeleton(cfg: ModelConfig, device: torch.device | str = "cpu") -> tuple[nn.Module, str]:
    """``build_model(cfg)`` with 1-row placeholder tables; returns the module and its collection's path."""
    placeholder = dataclasses.replace(
        cfg,
        tables=[
            dataclasses.replace(t, num_embeddings=1, weight_init_max=None, weight_init_min=None)
            for t in cfg.tables
        ],
    )
    model = build_model(placeholder, device=device)
    return model, find_embedding_bag_collection(model)


def replace_module(model: nn.Module, path: str, replacement: nn.Module) -> None:
    """Put ``replacement`` at ``path`` (dotted) inside ``model``."""
    parent_path, _, name = path.rpartition(".")
    parent = model.get_submodule(parent_path) if parent_path else model
    setattr(parent, name, replacement)


def dense_state_keys(model: nn.Module, ebc_path: str) -> list[str]:
    """State-dict keys of everything but the tables (the dense part, which the package stores as is)."""
    prefix = f"{ebc_path}." if ebc_path else ""
    return [key for key in model.state_dict() if not key.startswith(prefix)]


def compile_dense_part(model: nn.Module, ebc_path: str) -> list[str]:
    """``torch.compile`` every largest submodule that does not hold the lookups; returns their paths.

    The FBGEMM lookups stay eager (they are opaque custom ops); the dense layers get fused bias/activation
    kernels. Compiled with dynamic batch sizes, so a server's varying batches do not recompile.
    """
    compiled = []
    parts = ebc_path.split(".")
    for depth in range(len(parts)):
        ancestor_path = ".".join(parts[:depth])
        ancestor = model.get_submodule(ancestor_path) if ancestor_path else model
        for name, child in list(ancestor.named_children()):
            if name == parts[depth]:
                continue  # on the way to the lookups: its other children are compiled one level down
            setattr(ancestor, name, torch.compile(child, dynamic=True))
            compiled.append(f"{ancestor_path}.{name}" if ancestor_path else name)
    return compiled
