"""The interfaces of TorchRec's swappable planner components (``torchrec.distributed.planner.types``):
what an enumerator, proposer, partitioner and stats object provide. rectrain's are in
``rectrain.planner.proposers``, ``.partitioners`` and ``.stats``."""

from __future__ import annotations

import abc
from typing import Any

from rectrain.planner.sharding_option import ShardingOption


class Enumerator(abc.ABC):
    """Lists every table's sharding options of a module, estimated."""

    @abc.abstractmethod
    def __init__(
        self, topology: Any, batch_size: int, constraints: Any = None, estimator: Any = None
    ) -> None: ...

    @abc.abstractmethod
    def enumerate(self, module: Any, sharders: list[Any]) -> list[ShardingOption]: ...

    @abc.abstractmethod
    def populate_estimates(self, sharding_options: list[ShardingOption]) -> None: ...


class Proposer(abc.ABC):
    """Proposes one option per table at a time, told after each whether it could be placed."""

    @abc.abstractmethod
    def load(self, search_space: list[ShardingOption], enumerator: Enumerator | None = None) -> None: ...

    @abc.abstractmethod
    def feedback(
        self,
        partitionable: bool,
        plan: list[ShardingOption] | None = None,
        perf_rating: float | None = None,
        storage_constraint: Any = None,
    ) -> None: ...

    @abc.abstractmethod
    def propose(self) -> list[ShardingOption] | None: ...


class Partitioner(abc.ABC):
    """Places a proposal's shards on the ranks of ``storage_constraint`` (sets ``shard.rank``)."""

    @abc.abstractmethod
    def partition(self, proposal: list[ShardingOption], storage_constraint: Any) -> list[ShardingOption]: ...


class Stats(abc.ABC):
    """Logs what the planner found."""

    @abc.abstractmethod
    def log(self, *args: Any, **kwargs: Any) -> None: ...
