"""``AgreedBatches`` with a followed directory: a rank waiting for data holds its peers' batches (no rank
trains alone), a stop while waiting ends every rank, and ranks at different positions fail together."""

from __future__ import annotations

import torch

from rectrain.datasets.follow import WAITING
from rectrain.datasets.windows import DataPosition
from rectrain.distributed import ShardingEnv
from rectrain.models.batch import Batch
from rectrain.sparse import KeyedJaggedTensor
from rectrain.train.data import PositionedBatch
from rectrain.train.sync import AgreedBatches, DataReadError, RankAgreement, StopSignal
from tests.distributed.multiprocess import run_multiprocess


def _batch(rows: int, file: str, end: int) -> PositionedBatch:
    kjt = KeyedJaggedTensor(
        keys=["f"], values=torch.zeros(rows, dtype=torch.int64), lengths=torch.ones(rows, dtype=torch.int64)
    )
    batch = Batch(dense_features=torch.zeros(rows, 1), sparse_features=kjt, labels=torch.zeros(rows))
    return PositionedBatch(batch, DataPosition(0, end, "rows", "criteo", file))


def _consume(env: ShardingEnv, scenario: str) -> list:
    waits = 3 if env.rank == 1 else 0  # rank 1 sees each file a few polls after rank 0
    files = ["a.tsv", "b.tsv"] if scenario != "diverge" or env.rank == 0 else ["a.tsv", "c.tsv"]
    stream = []
    for file in files:
        stream += [WAITING] * waits + [_batch(4, file, 4), _batch(4, file, 8)]
    stop = StopSignal()
    batches = AgreedBatches(iter(stream), RankAgreement(env), stop, keyed=True)
    trained = []
    try:
        for _ in batches:
            trained.append(batches.trained()[1].file)
            if scenario == "stop" and len(trained) == 2:
                stop.requested = env.rank == 0  # asked while rank 1 is waiting for b.tsv
    except DataReadError as e:
        return [*trained, "error: different files" if "different files or rows" in str(e) else str(e)]
    return [*trained, f"stopped: {batches.stop_agreed}"]


def _scenarios(env: ShardingEnv) -> dict[str, list]:
    return {scenario: _consume(env, scenario) for scenario in ("follow", "stop", "diverge")}


def test_waiting_ranks_hold_their_peers_a_stop_ends_all_and_diverging_ranks_fail_together():
    for result in run_multiprocess(_scenarios, 2):  # one spawn for the three cases (spawning is slow)
        # rank 1 waits three polls before each file: rank 0 holds its batch, then both train it
        assert result["follow"] == ["a.tsv", "a.tsv", "b.tsv", "b.tsv", "stopped: False"]
        # rank 0 is asked to stop while rank 1 waits for b.tsv: both end there, b.tsv untrained
        assert result["stop"] == ["a.tsv", "a.tsv", "stopped: True"]
        # rank 1 would train c.tsv where rank 0 trains b.tsv: both fail before that step
        assert result["diverge"] == ["a.tsv", "a.tsv", "error: different files"]
