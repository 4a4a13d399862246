"""A training process over disk tables, killed by the test: saves step 2, then trains until SIGKILL.

``python -m tests.checkpoint.disk_kill_job <checkpoint dir> <disk tables dir>``; prints ``step N`` as each
step begins (after the checkpoint of step 2 is committed), so the test kills it inside a step."""

from __future__ import annotations

import sys

from rectrain.checkpoint import save_checkpoint
from rectrain.embedding import disk_tables
from tests.checkpoint import disk_common


def main(root: str, tables_dir: str) -> None:
    disk_tables.configure(disk_tables.DiskTablesSettings(dir=tables_dir, cache_bytes=disk_common.CACHE))
    model = disk_common.build("disk")
    optimizer = disk_common.make_optimizer(model)
    disk_common.train(model, optimizer, range(2))
    save_checkpoint(root, model=model, optimizer=optimizer, step=2)
    step = 2
    while True:
        print(f"step {step}", flush=True)
        disk_common.train(model, optimizer, range(step, step + 1))
        step += 1


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
