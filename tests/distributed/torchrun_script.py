"""Launched by test_env under ``torchrun``: joins through ``torchrun_session`` and reports what it saw.

Usage: torchrun --nproc-per-node N torchrun_script.py OUT_DIR  (writes OUT_DIR/rank_<r>.json)
"""

import json
import pathlib
import sys

import torch
import torch.distributed as dist

from rectrain.distributed import ShardingEnv
from rectrain.distributed.comm.env import exit_without_finalizing, torchrun_session


def main(out_dir: str) -> None:
    with torchrun_session() as env:
        _report(env, out_dir)
    exit_without_finalizing(0)


def _report(env: ShardingEnv, out_dir: str) -> None:
    total = torch.tensor([env.rank + 1])
    dist.all_reduce(total)
    report = {
        "rank": env.rank,
        "world_size": env.world_size,
        "local_rank": env.local_rank,
        "local_world_size": env.local_world_size,
        "backend": dist.get_backend(),
        "sum": total.item(),
    }
    (pathlib.Path(out_dir) / f"rank_{env.rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(sys.argv[1])
