"""The optimizer of a collection's sharded tables, taken the way TorchRec takes it, or refused.

A sharded table is updated inside backward by a fused kernel, so its optimizer must be known when the
collection is sharded. TorchRec reads it, per table, from the optimizer ``apply_optimizer_in_backward`` put on
the table's weight (``_optimizer_classes`` / ``_optimizer_kwargs``) over the sharder's ``fused_params``; with
neither it trains with FBGEMM's default, exact SGD at learning rate 0.01. rectrain does the same, with these
rules so that nothing changes silently:

- a collection built with ``fused_optimizer=`` (rectrain's own way) keeps it; giving another one is refused;
- a value rectrain's kernels cannot honour (an optimizer without a kernel, momentum, amsgrad, ...) is refused
  with the field named;
- one collection trains with one optimizer: tables that were given different ones are refused;
- FBGEMM's default is logged as a warning, naming how to choose another.

Two ``fused_params`` entries are not the optimizer's: ``bounds_check_mode`` (what an id outside its table
does, ``bounds_check_mode()``) is honoured by the id check; UVM caching (``cache_load_factor``,
``cache_algorithm``, ...) is refused by name, since rectrain's tables live whole on their rank.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from fbgemm_gpu.split_embedding_configs import SparseType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import BoundsCheckMode

from rectrain.embedding.config import BaseEmbeddingConfig, DataType, EmbOptimType, FusedOptimizerConfig
from rectrain.errors import ConfigError
from rectrain.optim import optimizers as trec_optimizers
from rectrain.optim.rowwise_adagrad import RowWiseAdagrad

logger = logging.getLogger(__name__)

_CLASSES: dict[type, EmbOptimType] = {
    torch.optim.SGD: EmbOptimType.SGD,
    torch.optim.Adagrad: EmbOptimType.ADAGRAD,
    torch.optim.Adam: EmbOptimType.ADAM,
    trec_optimizers.SGD: EmbOptimType.SGD,
    trec_optimizers.Adagrad: EmbOptimType.ADAGRAD,
    trec_optimizers.Adam: EmbOptimType.ADAM,
    RowWiseAdagrad: EmbOptimType.ROWWISE_ADAGRAD,
}
# FBGEMM's EmbOptimType names (TorchRec's fused_params["optimizer"]) -> the kernel rectrain runs.
_FBGEMM_NAMES = {
    "EXACT_SGD": EmbOptimType.SGD,
    "SGD": EmbOptimType.SGD,
    "EXACT_ADAGRAD": EmbOptimType.ADAGRAD,
    "ADAGRAD": EmbOptimType.ADAGRAD,
    "EXACT_ROWWISE_ADAGRAD": EmbOptimType.ROWWISE_ADAGRAD,
    "ROWWISE_ADAGRAD": EmbOptimType.ROWWISE_ADAGRAD,
    "ADAM": EmbOptimType.ADAM,
}
_FIELDS = {
    "learning_rate": "lr",
    "lr": "lr",
    "eps": "eps",
    "weight_decay": "weight_decay",
    "beta1": "beta1",
    "beta2": "beta2",
}
# Arguments that change nothing rectrain's kernels do, at the values given (torch's and FBGEMM's defaults).
_NEUTRAL = {
    "momentum": 0,
    "dampening": 0,
    "nesterov": False,
    "amsgrad": False,
    "maximize": False,
    "lr_decay": 0,
    "initial_accumulator_value": 0,
    "foreach": None,
    "fused": None,
    "differentiable": False,
    "capturable": False,
    "weight_decay_mode": None,
    "stochastic_rounding": True,
}
FBGEMM_DEFAULT = FusedOptimizerConfig(optimizer=EmbOptimType.SGD, lr=0.01)
BOUNDS_CHECK_MODE = "bounds_check_mode"
# TorchRec's UVM-caching fused params (FUSED_PARAM_* and CacheParams' fields as fused params).
_CACHE_PARAMS = (
    "cache_load_factor",
    "cache_algorithm",
    "cache_reserved_memory",
    "cache_precision",
    "prefetch_pipeline",
    "cache_prefetch_pipeline",
)

# CacheParams' fields -> their fused-params names.
_CACHE_FIELDS = {
    "algorithm": "cache_algorithm",
    "load_factor": "cache_load_factor",
    "reserved_memory": "cache_reserved_memory",
    "precision": "cache_precision",
    "prefetch_pipeline": "prefetch_pipeline",
    "multipass_prefetch_config": "multipass_prefetch_config",
}


def _optimizer_type(value: Any, where: str) -> EmbOptimType:
    if isinstance(value, EmbOptimType):
        return value
    name = getattr(value, "name", str(value)).upper()
    if name in _FBGEMM_NAMES:
        return _FBGEMM_NAMES[name]
    raise ConfigError(f"{where}: optimizer {name} has no rectrain kernel; use one of {sorted(_FBGEMM_NAMES)}")


def bounds_check_mode(params: Mapping[str, Any] | None, where: str = "fused_params") -> BoundsCheckMode:
    """FBGEMM's ``BoundsCheckMode`` from ``fused_params`` (rectrain's default: FATAL, never silent)."""
    value = (params or {}).get(BOUNDS_CHECK_MODE, BoundsCheckMode.FATAL)
    try:
        return value if isinstance(value, BoundsCheckMode) else BoundsCheckMode[str(value).upper()]
    except KeyError:
        names = [m.name for m in BoundsCheckMode]
        raise ConfigError(f"{where}: bounds_check_mode={value!r} is not one of {names}") from None


def optimizer_type_of(cls: type) -> EmbOptimType | None:
    """The fused kernel's optimizer for an in-backward optimizer class (None: it has no fused kernel)."""
    return _CLASSES.get(cls)


def config_from_fused_params(params: Mapping[str, Any], where: str) -> FusedOptimizerConfig:
    """A ``FusedOptimizerConfig`` from TorchRec ``fused_params`` (FBGEMM's argument names); unknown or
    unsupported entries raise ConfigError naming them."""
    values: dict[str, Any] = {}
    for key, value in params.items():
        if key == BOUNDS_CHECK_MODE:
            bounds_check_mode(params, where)  # not the optimizer's: read by the id check
        elif key in _CACHE_PARAMS:
            raise ConfigError(
                f"{where}: {key}={value!r} asks for UVM caching (fused_uvm_caching), which rectrain does not "
                "implement on CPU; leave it out: each shard is held whole in its rank's memory"
            )
        elif key == "optimizer":
            values["optimizer"] = _optimizer_type(value, where)
        elif key in _FIELDS:
            values[_FIELDS[key]] = float(value)
        elif key == "betas":
            values["beta1"], values["beta2"] = (float(b) for b in value)
        elif key == "weight_decay_mode" and getattr(value, "name", str(value)).upper() in ("NONE", "L2"):
            continue  # rectrain's kernels apply weight_decay as L2, FBGEMM's mode for torch's weight_decay
        elif key in _NEUTRAL and value == _NEUTRAL[key]:
            continue
        else:
            raise ConfigError(
                f"{where}: {key}={value!r} is not supported by rectrain's fused embedding kernels"
            )
    return FusedOptimizerConfig(**values)


def in_backward_params(weight: torch.Tensor, where: str) -> dict[str, Any] | None:
    """The fused params ``apply_optimizer_in_backward`` put on ``weight`` (None if it put none)."""
    classes = getattr(weight, "_optimizer_classes", None)
    if not classes:
        return None
    kwargs = getattr(weight, "_optimizer_kwargs", [{}])
    if len(classes) != 1 or len(kwargs) != 1:
        raise ConfigError(f"{where}: {len(classes)} in-backward optimizers; a sharded table takes one")
    return optimizer_params(classes[0], kwargs[0], f"{where}: in-backward optimizer")


def config_from_optimizer(
    cls: type, kwargs: Mapping[str, Any], where: str, location: Any = None
) -> FusedOptimizerConfig:
    """A ``FusedOptimizerConfig`` from a torch/TorchRec optimizer class and its arguments (TorchRec's fused
    modules' ``optimizer_type``/``optimizer_kwargs``); FBGEMM's UVM ``location`` s are refused by name."""
    if getattr(location, "name", "DEVICE") not in ("DEVICE", "HOST"):
        raise ConfigError(
            f"{where}: location={location.name} asks for UVM placement, which rectrain does not implement; "
            "leave it out (the tables live whole on `device`)"
        )
    return config_from_fused_params(optimizer_params(cls, kwargs, f"{where}: optimizer_type"), where)


def optimizer_params(cls: type, kwargs: Mapping[str, Any], where: str) -> dict[str, Any]:
    """Fused params of a torch/TorchRec optimizer class and its arguments (``config_from_fused_params``
    reads them); ConfigError for a class without a fused kernel."""
    if cls not in _CLASSES:
        names = sorted(c.__module__.split(".")[0] + "." + c.__name__ for c in _CLASSES)
        raise ConfigError(f"{where} {cls.__name__} has no fused kernel; use one of {names}")
    return {"optimizer": _CLASSES[cls], **kwargs}


def resolve(
    path: str,
    explicit: FusedOptimizerConfig | None,
    weights: Mapping[str, torch.Tensor],
    sharder_params: Mapping[str, Any] | None,
) -> FusedOptimizerConfig:
    """The optimizer the sharded tables of the collection at ``path`` train with (see the module doc).

    Args:
        path: the collection's module path (for messages).
        explicit: the collection's ``fused_optimizer=`` (rectrain's way), or None.
        weights: table name -> the unsharded weight (where ``apply_optimizer_in_backward`` left its marks).
        sharder_params: the matching sharder's ``fused_params``.
    """
    where = f"embedding collection {path or '<root>'!r}"
    if sharder_params and BOUNDS_CHECK_MODE in sharder_params:
        bounds_check_mode(sharder_params, where)
        sharder_params = {k: v for k, v in sharder_params.items() if k != BOUNDS_CHECK_MODE}
    per_table = {name: in_backward_params(w, f"{where}, table {name!r}") for name, w in weights.items()}
    given = {name: p for name, p in per_table.items() if p is not None}
    if explicit is not None:
        if given or sharder_params:
            raise ConfigError(
                f"{where} was built with fused_optimizer=...; it also got an optimizer through "
                f"{'apply_optimizer_in_backward' if given else 'the sharder fused_params'}: give it one way"
            )
        return explicit
    _check_one_optimizer(where, per_table)
    merged = {**(sharder_params or {}), **(next(iter(given.values())) if given else {})}
    if not merged:
        logger.warning(
            "%s: no optimizer given for its sharded tables; training them with FBGEMM's default as TorchRec "
            "does (exact SGD, lr 0.01). Choose one with apply_optimizer_in_backward(...) on the tables or "
            "the sharder's fused_params",
            where,
        )
        return FBGEMM_DEFAULT
    return config_from_fused_params(merged, where)


def _check_one_optimizer(where: str, per_table: Mapping[str, dict[str, Any] | None]) -> None:
    distinct: list[dict[str, Any] | None] = []
    for params in per_table.values():
        if params not in distinct:
            distinct.append(params)
    if len(distinct) > 1:
        by_table = {name: _describe(p) for name, p in per_table.items()}
        raise ConfigError(
            f"{where}: its tables were given different in-backward optimizers {by_table}; a sharded "
            "collection trains all its tables with one optimizer"
        )


def _describe(params: dict[str, Any] | None) -> str:
    if params is None:
        return "none"
    return ", ".join(f"{k}={getattr(v, 'value', v)}" for k, v in params.items())


def table_weights(
    tables: Sequence[BaseEmbeddingConfig], module: Any, attribute: str
) -> dict[str, torch.Tensor]:
    """``{table name: weight}`` of an unsharded collection (``attribute``: embedding_bags or embeddings)."""
    tables_module = getattr(module, attribute)
    return {t.name: tables_module[t.name].weight for t in tables}


def merge_fused_params(
    fused_params: dict[str, Any] | None = None, param_fused_params: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A copy of ``fused_params`` updated with a table's own (``lr`` spelled ``learning_rate``), as TorchRec
    merges a sharder's fused params with a table's."""
    own = dict(param_fused_params or {})
    if "lr" in own:
        own["learning_rate"] = own.pop("lr")
    return {**copy.deepcopy(fused_params or {}), **own}


def add_params_from_parameter_sharding(
    fused_params: dict[str, Any] | None, parameter_sharding: Any
) -> dict[str, Any]:
    """``fused_params`` (updated in place) with the table's kernel options from its ``ParameterSharding``
    (cache params, ``enforce_hbm``, ``stochastic_rounding``, ``bounds_check_mode``, ``output_dtype``), which
    take precedence, as in TorchRec; ``resolve``/``config_from_fused_params`` then honour or refuse each."""
    fused_params = {} if fused_params is None else fused_params
    cache = parameter_sharding.cache_params
    for field, key in _CACHE_FIELDS.items():
        if cache is not None and getattr(cache, field, None) is not None:
            fused_params[key] = getattr(cache, field)
    for key in ("enforce_hbm", "stochastic_rounding", "bounds_check_mode", "output_dtype"):
        if getattr(parameter_sharding, key, None) is not None:
            fused_params[key] = getattr(parameter_sharding, key)
    return fused_params


def convert_to_fbgemm_types(fused_params: dict[str, Any]) -> dict[str, Any]:
    """``fused_params`` with its ``DataType`` precisions as FBGEMM's ``SparseType`` (in place)."""
    for key in ("cache_precision", "weights_precision", "output_dtype"):
        if isinstance(fused_params.get(key), DataType):
            fused_params[key] = SparseType(fused_params[key].value.lower())
    return fused_params
