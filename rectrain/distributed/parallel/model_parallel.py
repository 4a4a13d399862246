"""``DistributedModelParallel``: shard a model's embedding collections by a plan, data-parallelise the rest.

The order of work (each a plain step below):
1. find every ``EmbeddingBagCollection`` / ``EmbeddingCollection`` in the model;
2. take each collection's fused optimizer as TorchRec takes it (``fused_params``), or refuse;
3. plan (rank 0 plans, every rank receives the same plan) unless a plan is given, and refuse a plan whose
   estimated memory does not fit some rank (``rectrain.planner.memory``) before anything is allocated;
4. agree on the CPU embedding backward that ``cpu_backward="auto"`` runs (rank 0's choice, on every rank);
5. replace each collection by its sharded form on this rank: only this rank's shards are allocated, with
   the collection's weights, or (a collection built on the meta device, fused or TorchRec's way) the initial
   values it would have had;
6. allocate and initialise any other module still on the meta device, move the rest to the device and wrap
   it in DDP, telling DDP to leave the fused tables alone (they are never replicated; their updates happen
   inside backward). Trainable data-parallel tables (a collection built TorchRec's way) are DDP's like any
   dense parameter.
"""

from __future__ import annotations

import abc
import logging
from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from rectrain import compat
from rectrain.distributed.comm.env import ShardingEnv
from rectrain.distributed.parallel import fused_params
from rectrain.distributed.parallel.backward_agreement import agree_on_auto
from rectrain.distributed.sharded.embedding import ShardedEmbeddingCollection
from rectrain.distributed.sharded.embedding_bag import ShardedEmbeddingBagCollection
from rectrain.embedding import EmbeddingBagCollection, EmbeddingCollection, FusedOptimizerConfig
from rectrain.embedding.backward_choice import BackwardChoice, cpu_backward_choice, resolved
from rectrain.errors import ConfigError
from rectrain.optim import CombinedOptimizer
from rectrain.planner import EmbeddingShardingPlanner, ShardingPlan, Topology
from rectrain.planner.memory import check_fits, rank_memory
from rectrain.planner.planner import BATCH_SIZE
from rectrain.planner.types import ShardingType
from rectrain.zch.module import ManagedCollisionModule

logger = logging.getLogger(__name__)

_COLLECTIONS = (EmbeddingBagCollection, EmbeddingCollection)


def _default_device(env: ShardingEnv) -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", env.local_rank % torch.cuda.device_count())
    return torch.device("cpu")


def find_collections(module: nn.Module) -> dict[str, nn.Module]:
    """``{path: collection}`` of every embedding collection in ``module`` (outermost, in module order)."""
    found: dict[str, nn.Module] = {}
    for path, child in module.named_modules():
        if isinstance(child, _COLLECTIONS) and not any(path.startswith(f"{p}.") for p in found):
            found[path] = child
    return found


def _tables_of(collection: nn.Module) -> list:
    if isinstance(collection, EmbeddingBagCollection):
        return collection.embedding_bag_configs()
    return collection.embedding_configs()


def collection_optimizers(
    collections: dict[str, nn.Module], sharders: list | None
) -> dict[str, FusedOptimizerConfig]:
    """``{path: the fused optimizer of its sharded tables}``, as TorchRec takes it (``fused_params``)."""
    optimizers = {}
    for path, collection in collections.items():
        attribute = "embedding_bags" if isinstance(collection, EmbeddingBagCollection) else "embeddings"
        weights = fused_params.table_weights(_tables_of(collection), collection, attribute)
        optimizers[path] = fused_params.resolve(
            path, collection.fused_optimizer_config, weights, _sharder_fused_params(sharders, collection)
        )
    return optimizers


def _sharder_fused_params(sharders: list | None, collection: nn.Module) -> dict[str, Any] | None:
    """The ``fused_params`` of the first sharder for ``collection``'s type (TorchRec's sharder choice)."""
    for sharder in sharders or []:
        module_type = getattr(sharder, "module_type", None)
        if isinstance(module_type, type) and isinstance(collection, module_type):
            return getattr(sharder, "fused_params", None)
    return None


def plan_collections(
    collections: dict[str, nn.Module],
    env: ShardingEnv,
    device: torch.device,
    batch_size: int | None,
    sharders: list | None = None,
    optimizers: dict[str, FusedOptimizerConfig] | None = None,
) -> ShardingPlan:
    """Plan every collection on rank 0 for this world and broadcast the plan to all ranks."""
    topology = Topology(
        world_size=env.world_size, compute_device=device.type, local_world_size=env.local_world_size
    )
    # The planner sizes optimizer state from one config; the largest state per row is the safe estimate.
    optimizers = list((optimizers or collection_optimizers(collections, sharders)).values())
    largest = max(optimizers, key=lambda config: config.state_floats_per_row(128))
    planner = EmbeddingShardingPlanner(topology=topology, batch_size=batch_size, fused_optimizer=largest)
    tables = {path: _tables_of(c) for path, c in collections.items()}
    return planner.collective_plan(tables, sharders, pg=env.pg)


def _shard(
    collection: nn.Module,
    path: str,
    plan: ShardingPlan,
    env: ShardingEnv,
    device: torch.device,
    optimizer: FusedOptimizerConfig,
    auto: BackwardChoice | None,
    sharders: list | None = None,
) -> nn.Module:
    module_plan = plan.get_plan_for_module(path)
    if module_plan is None:
        raise ConfigError(f"the sharding plan has no entry for the embedding collection at {path!r}")
    optimizer = resolved(optimizer, auto)
    bounds = fused_params.bounds_check_mode(_sharder_fused_params(sharders, collection), path or "<root>")
    kind = ShardedEmbeddingBagCollection if isinstance(collection, EmbeddingBagCollection) else None
    kind = kind or ShardedEmbeddingCollection
    return kind(collection, module_plan, env, device, fused_optimizer=optimizer, bounds_check_mode=bounds)


def refuse_managed_collision(module: nn.Module) -> None:
    """Managed-collision remappers are not sharded yet. Left unsharded, each rank would remap its own batch
    with its own state and the ranks' rows would stop meaning the same ids: refuse instead."""
    for path, child in module.named_modules():
        if isinstance(child, ManagedCollisionModule):
            raise ConfigError(
                f"DistributedModelParallel cannot shard the managed-collision module at {path!r} yet "
                "(TorchRec shards remappers row-wise with their tables); train this model unsharded"
            )


def refuse_unsupported_sharders(sharders: list | None) -> None:
    """Sharders that exist for planning only (the embedding-tower sharders) say why they cannot shard."""
    for sharder in sharders or []:
        reason = getattr(sharder, "unsupported_reason", None)
        if reason:
            raise ConfigError(f"DistributedModelParallel: {reason}")


def check_memory(
    plan: ShardingPlan,
    collections: dict[str, nn.Module],
    module: nn.Module,
    topology: Topology,
    batch_size: int | None,
    optimizers: dict[str, FusedOptimizerConfig],
) -> None:
    """Refuse, before anything is allocated, a plan whose estimated resident memory on some rank exceeds the
    memory that rank may use (``rectrain.planner.memory``; CPU ranks, where the estimate is calibrated)."""
    if topology.compute_device != "cpu":
        return
    embedding = {id(p) for c in collections.values() for p in c.parameters()}
    dense = sum(p.numel() * p.element_size() for p in module.parameters() if id(p) not in embedding)
    dense += _trainable_replica_bytes(plan, collections) // 2
    # The optimizer each collection's sharded tables train with (``collection_optimizers``); as the planner
    # does, the largest state per row is the safe estimate.
    optimizer = max(optimizers.values(), key=lambda config: config.state_floats_per_row(128))
    # Disk tables (``storage = "disk"``) live in mapped files, reclaimable page cache: not a rank's private
    # memory (``rectrain.planner.memory_budget`` plans their cache).
    tables = {path: [t for t in _tables_of(c) if t.storage != "disk"] for path, c in collections.items()}
    memory = rank_memory(plan, tables, optimizer, batch_size or BATCH_SIZE, dense)
    capacity = [topology.capacity(r) for r in range(topology.world_size)]
    check_fits(memory, capacity, "the sharding plan does not fit this machine")


def _trainable_replica_bytes(plan: ShardingPlan, collections: dict[str, nn.Module]) -> int:
    """Bytes of the data-parallel tables that stay trainable parameters (collections built TorchRec's way).

    ``rank_memory`` counts a replica's weights and an optimizer state; such a table also holds a dense
    gradient and a DDP bucket, which half its bytes counted as dense part (x 4) add."""
    total = 0
    for path, collection in collections.items():
        if collection.fused_optimizer_config is not None:
            continue
        module_plan = plan.get_plan_for_module(path) or {}
        for table in _tables_of(collection):
            sharding = module_plan.get(table.name)
            if sharding is not None and sharding.sharding_type is ShardingType.DATA_PARALLEL:
                total += int(table.num_embeddings * table.embedding_dim * table.data_type.bits / 8)
    return total


def _materialise_meta(module: nn.Module, sharded_paths: list[str], device: torch.device) -> None:
    """Allocate on ``device`` and re-initialise (``reset_parameters``) every module outside the sharded
    collections that still holds meta tensors, as TorchRec's DMP does for a model built on the meta device."""
    inside = tuple(f"{p}." for p in sharded_paths)
    for path, child in module.named_modules():
        if path in sharded_paths or path.startswith(inside):
            continue
        own = [*child.parameters(recurse=False), *child.buffers(recurse=False)]
        if any(t.is_meta for t in own):
            child.to_empty(device=device, recurse=False)
            if hasattr(child, "reset_parameters"):
                child.reset_parameters()


def _replace(root: nn.Module, path: str, new: nn.Module) -> nn.Module:
    if not path:
        return new
    parent_path, _, name = path.rpartition(".")
    setattr(root.get_submodule(parent_path), name, new)
    return root


class ShardedCollections(NamedTuple):
    """What ``shard_collections`` did: the model (the same object unless it was itself a collection)."""

    module: nn.Module
    plan: ShardingPlan | None
    cpu_backward: dict[str, BackwardChoice]
    paths: list[str]


def shard_collections(
    module: nn.Module,
    env: ShardingEnv,
    device: torch.device,
    plan: ShardingPlan | None = None,
    sharders: list | None = None,
    batch_size: int | None = None,
    topology: Topology | None = None,
    *,
    planned_only: bool = False,
) -> ShardedCollections:
    """Steps 1-5 of the module doc: replace each embedding collection of ``module`` by its sharded form.

    ``planned_only``: a collection the given plan has no entry for stays unsharded (TorchRec's
    ``shard_modules``); otherwise it is refused, since DMP would silently train it replicated but unsynced.
    Sharders restrict the collections to their module types when ``planned_only`` (TorchRec shards only
    the module types it has sharders for)."""
    refuse_managed_collision(module)
    refuse_unsupported_sharders(sharders)
    collections = find_collections(module)
    if planned_only and sharders:
        types = tuple(s.module_type for s in sharders if isinstance(getattr(s, "module_type", None), type))
        collections = {p: c for p, c in collections.items() if isinstance(c, types)}
    if planned_only and plan is not None:
        collections = {p: c for p, c in collections.items() if plan.get_plan_for_module(p) is not None}
    optimizers = collection_optimizers(collections, sharders)
    if plan is None and collections:
        plan = plan_collections(collections, env, device, batch_size, sharders, optimizers)
    if plan is not None and collections:
        topology = topology or Topology(
            world_size=env.world_size, compute_device=device.type, local_world_size=env.local_world_size
        )
        check_memory(plan, collections, module, topology, batch_size, optimizers)
    auto = agree_on_auto(env, device) if collections else None
    cpu_backward = {path: cpu_backward_choice(optimizers[path], device, auto) for path in collections}
    for path, collection in collections.items():
        sharded = _shard(collection, path, plan, env, device, optimizers[path], auto, sharders)
        module = _replace(module, path, sharded)
    return ShardedCollections(module, plan, cpu_backward, list(collections))


class DataParallelWrapper(abc.ABC):
    """TorchRec's interface for replicating DMP's dense part: ``wrap(dmp, env, device)`` replaces
    ``dmp._dmp_wrapped_module`` with its replicated form."""

    @abc.abstractmethod
    def wrap(self, dmp: DistributedModelParallel, env: ShardingEnv, device: torch.device) -> None: ...


class DefaultDataParallelWrapper(DataParallelWrapper):
    """DDP over the trainable parameters that are not sharded, with TorchRec's options (passed to
    ``DistributedDataParallel``). Quantized all-reduce (``allreduce_comm_precision``) is refused by name."""

    def __init__(
        self,
        bucket_cap_mb: int = 25,
        static_graph: bool = True,
        find_unused_parameters: bool = False,
        allreduce_comm_precision: str | None = None,
        params_to_ignore: list[str] | None = None,
        ddp_kwargs: dict[str, Any] | None = None,
    ) -> None:
        if allreduce_comm_precision not in (None, "fp32"):
            raise ConfigError(
                f"DefaultDataParallelWrapper(allreduce_comm_precision={allreduce_comm_precision!r}) is not "
                "supported: rectrain all-reduces the dense gradients in fp32 (leave it None)"
            )
        self._options = {
            "bucket_cap_mb": bucket_cap_mb,
            "static_graph": static_graph,
            "find_unused_parameters": find_unused_parameters,
            **(ddp_kwargs or {}),
        }
        self._ignored = set(params_to_ignore or [])

    def wrap(self, dmp: DistributedModelParallel, env: ShardingEnv, device: torch.device) -> None:
        dmp._dmp_wrapped_module = dmp._wrap_dense(dmp._dmp_wrapped_module, self._ignored, self._options)


class DistributedModelParallel(nn.Module):
    """A model whose embedding collections are sharded across the ranks of ``env`` (``torchrec``'s DMP).

    Args:
        module: the unsharded model, built identically on every rank. Build it (or its collections) on the
            meta device so that no process ever holds a whole table: each rank then allocates and
            initialises its own shards only, with the values the unsharded model would have had.
        env: this rank's place in the process group; default: the initialised default group.
        device: where this rank's shards and dense part live; default ``cuda:<local rank>`` if CUDA, else cpu.
        plan: a sharding plan (for instance loaded from JSON); planned collectively when omitted.
        sharders: TorchRec-style sharders; when planning, their ``sharding_types(device)`` restrict choices,
            and their ``fused_params`` choose the fused optimizer (see ``fused_params``).
        init_data_parallel: wrap the dense part in DDP now (else call ``init_data_parallel()`` later).
        init_parameters: must be True: rectrain always initialises the shards it allocates (TorchRec can
            leave meta-device parameters for the caller); False is refused by name.
        data_parallel_wrapper: how the dense part is replicated (TorchRec's ``DataParallelWrapper``);
            default DDP (with DDP's defaults) over the trainable parameters that are not sharded.
        batch_size: the per-rank batch size the planner assumes when planning.
        topology: the memory each rank may use (default: this host's memory over its local ranks); a plan
            whose estimated resident memory exceeds it on some rank is refused before anything is allocated.

    ``dmp(...)`` calls the model; ``dmp.module`` is the sharded model without the DDP wrapper;
    ``dmp.cpu_backward`` says, per collection path, which kernel its tables train with and why (on CPU,
    ``auto`` is rank 0's choice on every rank); ``dmp.fused_optimizer`` steps (no-ops) and checkpoints every
    collection's fused optimizer, and ``state_dict()`` gives each sharded table as TorchRec does: a
    ``ShardedTensor`` (plain tensor if data-parallel), which ``torch.distributed.checkpoint`` saves and
    re-shards.
    """

    def __init__(
        self,
        module: nn.Module,
        env: ShardingEnv | None = None,
        device: torch.device | str | None = None,
        plan: ShardingPlan | None = None,
        sharders: list | None = None,
        init_data_parallel: bool = True,
        init_parameters: bool = True,
        data_parallel_wrapper: DataParallelWrapper | None = None,
        *,
        batch_size: int | None = None,
        topology: Topology | None = None,
    ) -> None:
        super().__init__()
        if not init_parameters:
            raise ConfigError(
                "DistributedModelParallel(init_parameters=False) is not supported: rectrain initialises "
                "every shard it allocates (build the model on the meta device to skip unsharded allocation)"
            )
        if env is None:
            if not (dist.is_available() and dist.is_initialized()):
                raise ConfigError(
                    "DistributedModelParallel needs torch.distributed: launch with torchrun and call "
                    "rectrain.distributed.init_from_env() first, or pass env=ShardingEnv(...)"
                )
            env = ShardingEnv.from_process_group(dist.group.WORLD)
        self.env = env
        self.device = torch.device(device) if device is not None else _default_device(env)
        done = shard_collections(module, env, self.device, plan, sharders, batch_size, topology)
        module, self.plan, self.cpu_backward = done.module, done.plan, done.cpu_backward
        self._sharded_paths = list(done.paths)
        _materialise_meta(module, self._sharded_paths, self.device)
        self._dmp_wrapped_module: nn.Module = module.to(self.device)
        self._data_parallel_wrapper = data_parallel_wrapper
        if init_data_parallel:
            self.init_data_parallel()
        logger.info(
            "DistributedModelParallel on rank %d/%d: sharded %s", env.rank, env.world_size, done.paths
        )

    def init_data_parallel(self) -> None:
        """Replicate the dense part with the data-parallel wrapper (once; a no-op when already wrapped)."""
        if isinstance(self._dmp_wrapped_module, DistributedDataParallel):
            return
        if self._data_parallel_wrapper is None:  # rectrain's default: DDP with its own defaults
            self._dmp_wrapped_module = self._wrap_dense(self._dmp_wrapped_module)
        else:
            self._data_parallel_wrapper.wrap(self, self.env, self.device)

    def _wrap_dense(
        self, module: nn.Module, ignored: set[str] = frozenset(), options: dict | None = None
    ) -> nn.Module:
        if not any(p.requires_grad for p in module.parameters()):
            return module
        # Fused tables (no gradient) are never replicated; trainable data-parallel tables are.
        sharded = {
            f"{path}.{name}" if path else name
            for path in self._sharded_paths
            for name, param in module.get_submodule(path).named_parameters()
            if not param.requires_grad
        }
        device_ids = [self.device] if self.device.type == "cuda" else None
        return compat.data_parallel(
            module,
            device_ids=device_ids,
            process_group=self.env.pg,
            ignored=sharded | ignored,
            options=options,
        )

    @property
    def module(self) -> nn.Module:
        """The sharded model, without the DDP wrapper."""
        wrapped = self._dmp_wrapped_module
        return wrapped.module if isinstance(wrapped, DistributedDataParallel) else wrapped

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._dmp_wrapped_module(*args, **kwargs)

    def sharded_modules(self) -> dict[str, nn.Module]:
        return {path: self.module.get_submodule(path) for path in self._sharded_paths}

    @property
    def fused_optimizer(self) -> torch.optim.Optimizer:
        """Every sharded collection's fused optimizer, keyed by module path (``step()`` does nothing)."""
        members = [(path or "model", m.fused_optimizer) for path, m in self.sharded_modules().items()]
        if not members:
            raise ConfigError("this model has no embedding collections, so no fused optimizer")
        return members[0][1] if len(members) == 1 else CombinedOptimizer(members)

    def named_parameters(
        self, prefix: str = "", recurse: bool = True, remove_duplicate: bool = True
    ) -> Iterator[tuple[str, nn.Parameter]]:
        """The model's parameters under the model's own names (no DDP or DMP prefixes)."""
        yield from self.module.named_parameters(prefix, recurse, remove_duplicate)

    def state_dict(
        self, *args: Any, destination: Any = None, prefix: str = "", keep_vars: bool = False
    ) -> Any:
        """The model's state under its own names (no DMP/DDP prefixes), as TorchRec's DMP gives it: each
        sharded table once, as a ``ShardedTensor`` (a plain tensor if data-parallel)."""
        return self.module.state_dict(*args, destination=destination, prefix=prefix, keep_vars=keep_vars)

    def load_state_dict(
        self, state_dict: Mapping[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        """Load dense tensors as usual and each sharded table from a ``ShardedTensor``, ``DTensor`` or full
        tensor (re-sharded to this rank's shards)."""
        return self.module.load_state_dict(state_dict, strict=strict, assign=assign)
