"""Models trained with TorchRec -> our prediction module's state dict (and ``ModelConfig``), for export.

Sources: a ``torch.distributed.checkpoint`` directory written from TorchRec's ``DistributedModelParallel``
(any world size and sharding; see ``dcp_reader``), a ``.safetensors`` file of a plain (unsharded) TorchRec
``state_dict()``, or a module in memory (``export_package(model=...)``), quantized or not; a pickled
``torch.save`` file (such as TorchRec's ``model.pt``) is refused, never unpickled. torchrec is never imported:
only the state dict's key layout matters.

Where the model sits in the state dict is found from its first table's key: everything before
``sparse_arch.embedding_bag_collection.embedding_bags.<table>.weight`` (DLRM, DLRM_DCN) or
``ebc.embedding_bags.<table>.weight`` (two-tower) is a wrapper prefix (DCP's ``model.`` top-level key,
``DLRMTrain``'s ``model.``, TwoTowerTrainTask's ``two_tower.``, DMP's ``_dmp_wrapped_module.`` and DDP's
``module.``) and is dropped, as is ``torch.compile``'s ``_orig_mod.``. Entries outside the model (the fused
optimizer state, other top-level keys) are ignored.

Key layouts: TorchRec's DLRM and DLRM_DCN keys are ours under ``model.``. TorchRec's two-tower example
(``examples/retrieval/modules/two_tower.py``) ends each tower with a ReLU layer (``MLP`` of all its sizes)
where ours ends with a plain Linear; the import maps TorchRec's towers onto our tower's MLP part and appends
an identity Linear (``tower_layer_sizes + [last]``), so the served scores are exactly TorchRec's.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from recserve.errors import ExportError
from recserve.export.quantize import dequantize_table
from recserve.runtime.layout import QuantizedTable
from rectrain.models.config import ModelConfig

logger = logging.getLogger(__name__)

_ARCH_CHILDREN = {
    "dlrm": ("sparse_arch", "dense_arch", "inter_arch", "over_arch"),
    "dlrm_dcn": ("sparse_arch", "dense_arch", "inter_arch", "over_arch"),
    "two_tower": ("ebc", "query_proj", "candidate_proj"),
}
_TOWERS = ("query_proj", "candidate_proj")
_TORCHREC_TOWER_LAYER = re.compile(r"^(query_proj|candidate_proj)\._mlp\.(\d+)\._linear\.(weight|bias)$")


def table_suffix(cfg: ModelConfig, table: str) -> str:
    """The key of ``table``'s weight relative to the TorchRec architecture module of ``cfg.kind``."""
    if cfg.kind == "two_tower":
        return f"ebc.embedding_bags.{table}.weight"
    return f"sparse_arch.embedding_bag_collection.embedding_bags.{table}.weight"


def _normalize(key: str) -> str:
    return key.replace("_orig_mod.", "")


def model_keys(keys: list[str], cfg: ModelConfig, where: str) -> dict[str, str]:
    """``{source key: key relative to the architecture}`` for the model entries among ``keys``."""
    suffix = table_suffix(cfg, cfg.tables[0].name)
    normal = {key: _normalize(key) for key in keys}
    prefixes = sorted(
        {
            n[: -len(suffix)]
            for n in normal.values()
            if n.endswith(suffix) and (n == suffix or n[-len(suffix) - 1] == ".")
        }
    )
    if not prefixes:
        sample = sorted(keys)[:6]
        raise ExportError(
            f"{where}: no tensor named [<prefix>.]{suffix}; the model config ({cfg.kind}, first table "
            f"{cfg.tables[0].name!r}) does not describe this checkpoint, whose tensors include {sample}"
        )
    if len(prefixes) > 1:
        raise ExportError(f"{where}: the model's tables appear under several prefixes {prefixes}; keep one")
    prefix = prefixes[0]
    children = _ARCH_CHILDREN[cfg.kind]
    selected = {}
    for key, n in normal.items():
        relative = n[len(prefix) :]
        if n.startswith(prefix) and relative.split(".", 1)[0] in children:
            selected[key] = relative
    ignored = len(keys) - len(selected)
    logger.info("%s: model found under prefix %r; %d other entries ignored", where, prefix, ignored)
    return selected


def to_prediction_state(
    cfg: ModelConfig, arch_state: Mapping[str, Tensor], where: str
) -> tuple[ModelConfig, dict[str, Tensor]]:
    """Architecture-relative TorchRec keys -> ``(config, our prediction-module state dict)``."""
    state = {key: value.detach() for key, value in arch_state.items()}
    for table in cfg.tables:  # TorchRec tables may be fp16; export quantizes from fp32
        key = table_suffix(cfg, table.name)
        if key in state:
            state[key] = state[key].float()
    if cfg.kind == "two_tower" and any(_TORCHREC_TOWER_LAYER.match(key) for key in state):
        cfg, state = _torchrec_towers(cfg, state, where)
    return cfg, {f"model.{key}": value for key, value in state.items()}


def _torchrec_towers(
    cfg: ModelConfig, state: dict[str, Tensor], where: str
) -> tuple[ModelConfig, dict[str, Tensor]]:
    """TorchRec's all-ReLU towers as our ``MLP + Linear`` towers, the Linear being the identity."""
    sizes = list(cfg.tower_layer_sizes)
    out = {k: v for k, v in state.items() if not k.startswith(_TOWERS)}
    for tower in _TOWERS:
        layers = sorted(
            {int(m.group(2)) for k in state if (m := _TORCHREC_TOWER_LAYER.match(k)) and m[1] == tower}
        )
        if layers != list(range(len(sizes))):
            raise ExportError(
                f"{where}: TorchRec's {tower} has layers {layers}, the model config's tower_layer_sizes "
                f"{sizes} needs layers 0..{len(sizes) - 1}"
            )
        for key, value in state.items():
            if key.startswith(f"{tower}."):
                out[key.replace(f"{tower}._mlp.", f"{tower}.0._mlp.", 1)] = value
        out[f"{tower}.1.weight"] = torch.eye(sizes[-1])
        out[f"{tower}.1.bias"] = torch.zeros(sizes[-1])
    logger.info("%s: TorchRec towers end in a ReLU layer; appended an identity Linear to each", where)
    return dataclasses.replace(cfg, tower_layer_sizes=[*sizes, sizes[-1]]), out


def import_state_dict(
    cfg: ModelConfig, state_dict: Mapping[str, Any], where: str = "state_dict"
) -> tuple[ModelConfig, dict[str, Tensor]]:
    """A TorchRec (or our) model's full state dict, under any wrapper prefix -> (config, our state dict)."""
    selected = model_keys(list(state_dict), cfg, where)
    arch = {
        relative: _full_tensor(state_dict[key], f"{where}[{key!r}]") for key, relative in selected.items()
    }
    return to_prediction_state(cfg, arch, where)


def quantized_tables_of(model: nn.Module) -> dict[str, dict[str, QuantizedTable]]:
    """``{module path: {table: rows}}`` of the quantized collections in ``model`` (those that give their
    serving rows with ``quantized_tables()``, as ``rectrain.quant.EmbeddingBagCollection`` does)."""
    return {
        path: module.quantized_tables()
        for path, module in model.named_modules()
        if callable(getattr(module, "quantized_tables", None))
    }


def import_module(cfg: ModelConfig, model: nn.Module) -> tuple[ModelConfig, dict[str, Tensor]]:
    """``import_state_dict`` of ``model.state_dict()`` (a TorchRec DLRM, DMP on one rank, or one of ours).

    A quantized collection's entries (``embedding_bags.<table>.weight`` as uint8 rows, and any split
    ``weight_qscale``/``weight_qbias``) are replaced by the float32 values its lookups see; export then
    writes its rows as they are (``exporter``), not re-quantized."""
    state = dict(model.state_dict())
    for path, tables in quantized_tables_of(model).items():
        prefix = f"{path}.embedding_bags." if path else "embedding_bags."
        state = {key: value for key, value in state.items() if not key.startswith(prefix)}
        state.update({f"{prefix}{name}.weight": dequantize_table(table) for name, table in tables.items()})
    return import_state_dict(cfg, state, where=type(model).__name__)


def _full_tensor(value: Any, where: str) -> Tensor:
    """A plain tensor of ``value``: DTensor gathered, a ShardedTensor assembled if all its shards are here."""
    if hasattr(value, "full_tensor"):  # DTensor
        return value.full_tensor()
    if hasattr(value, "local_shards") and hasattr(value, "metadata"):  # ShardedTensor
        full = torch.empty(tuple(value.size()), dtype=value.dtype)
        volume = 0
        for shard in value.local_shards():
            view = full
            for dim, (offset, size) in enumerate(
                zip(shard.metadata.shard_offsets, shard.metadata.shard_sizes)
            ):
                view = view.narrow(dim, offset, size)
            view.copy_(shard.tensor.detach().cpu())
            volume += shard.tensor.numel()
        if volume != full.numel():
            raise ExportError(
                f"{where}: a ShardedTensor with shards on other ranks; save the model with "
                "torch.distributed.checkpoint and export with --from-torchrec DIR"
            )
        return full
    if not isinstance(value, Tensor):
        raise ExportError(f"{where}: expected a tensor, got {type(value).__name__}")
    return value


def load_torchrec(
    path: str | Path, cfg: ModelConfig
) -> tuple[ModelConfig, dict[str, Tensor], dict[str, Any]]:
    """``(config, our prediction state dict, manifest source)`` of a DCP directory or a safetensors file."""
    path = Path(path)
    source: dict[str, Any] = {"torchrec": str(path.resolve())}
    if path.is_dir():
        from recserve.export.dcp_reader import DcpCheckpoint

        checkpoint = DcpCheckpoint(path)
        selected = model_keys(list(checkpoint.entries), cfg, str(path))
        tensors = checkpoint.read(selected)
        source["format"] = "torch.distributed.checkpoint"
    elif path.is_file() and path.suffix == ".safetensors":
        tensors, selected = _read_safetensors(path, cfg)
        source["format"] = "safetensors"
    elif not path.exists():
        raise ExportError(f"--from-torchrec {path}: does not exist")
    else:
        raise ExportError(
            f"--from-torchrec {path}: expected a torch.distributed.checkpoint directory or a .safetensors "
            "file of a model state_dict (pickled torch.save files are never read: save the state dict with "
            "safetensors.torch.save_file, or the model with torch.distributed.checkpoint)"
        )
    cfg, state = to_prediction_state(cfg, {selected[k]: v for k, v in tensors.items()}, str(path))
    return cfg, state, source


def _read_safetensors(path: Path, cfg: ModelConfig) -> tuple[dict[str, Tensor], dict[str, str]]:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            selected = model_keys(list(f.keys()), cfg, str(path))
            return {key: f.get_tensor(key) for key in selected}, selected
    except SafetensorError as error:
        raise ExportError(f"{path}: not a readable safetensors file ({error})") from None


def read_model_config(path: str | Path) -> ModelConfig:
    """Our ``ModelConfig`` from a TOML or JSON file: a ``[model]`` table (a training config) or the model
    table itself."""
    from rectrain.errors import ConfigError
    from rectrain.train.schema import load_toml

    path = Path(path)
    try:
        if path.suffix == ".json":
            try:
                document = json.loads(path.read_text())
            except FileNotFoundError:
                raise ConfigError(f"config file {path} does not exist") from None
            except json.JSONDecodeError as error:
                raise ConfigError(f"{path.name}: not valid JSON: {error}") from None
        elif path.suffix == ".toml":
            document = load_toml(path)
        else:
            raise ConfigError(f"{path}: expected a .toml or .json model config")
        if isinstance(document, dict) and isinstance(document.get("model"), dict):
            return ModelConfig.from_dict(document["model"], where=f"{path.name}: model")
        return ModelConfig.from_dict(document, where=path.name)
    except ConfigError as error:
        raise ExportError(f"--model-config: {error}") from None
