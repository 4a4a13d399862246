"""Initial table values as a function of (seed, table name, global row), whatever builds them.

A table's rows are drawn in fixed blocks of ``ROW_BLOCK`` rows at the table's full width; block ``b`` of table
``t`` comes from a generator seeded with a hash of ``(seed, t, b)``. Any rectangle of a table (a row shard, a
column shard, the whole table) is cut out of those blocks, so the unsharded collection and every rank of any
plan hold bit-identical values, whichever rank builds which shard and in what order, and a rank never draws
more than one block of rows it does not own.

The values of a block are ``init_fn(block)`` when the table config has an ``init_fn`` (TorchRec's field; it
draws from torch's default CPU generator, which is seeded for the block and restored afterwards), otherwise
uniform in ``[weight_init_min, weight_init_max]``. An ``init_fn`` whose values depend on the tensor's shape
(``xavier_uniform_`` reads fan-in/fan-out) sees blocks of at most ``ROW_BLOCK`` rows, not the whole table.
"""

from __future__ import annotations

import hashlib

import torch
from torch import Tensor

from rectrain.embedding.config import BaseEmbeddingConfig

ROW_BLOCK = 4096
_SEED_RANGE = 2**62


def draw_seed() -> int:
    """A collection's initialisation seed, drawn from torch's default CPU generator (``torch.manual_seed``
    before building a collection fixes its tables)."""
    return int(torch.randint(0, _SEED_RANGE, (1,), device="cpu").item())


def block_seed(seed: int, table: str, block: int) -> int:
    """The generator seed of one block of rows: a hash, so that neighbouring blocks are unrelated."""
    digest = hashlib.blake2b(f"{seed}/{table}/{block}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % _SEED_RANGE


def _draw(table: BaseEmbeddingConfig, seed: int, block: int, rows: int) -> Tensor:
    values = torch.empty(rows, table.embedding_dim, dtype=torch.float32, device="cpu")
    init_fn = getattr(table, "init_fn", None)
    if init_fn is None:
        generator = torch.Generator(device="cpu").manual_seed(block_seed(seed, table.name, block))
        return values.uniform_(table.get_weight_init_min(), table.get_weight_init_max(), generator=generator)
    with torch.random.fork_rng(devices=[]):
        torch.default_generator.manual_seed(block_seed(seed, table.name, block))
        init_fn(values)
    return values


@torch.no_grad()
def fill_rows(
    out: Tensor, table: BaseEmbeddingConfig, seed: int, row_offset: int = 0, col_offset: int = 0
) -> None:
    """Write rows ``row_offset..`` and columns ``col_offset..`` of ``table``'s initial values into ``out``.

    ``out`` is ``[rows, cols]`` on any device and of any float dtype (a shard, or the whole table); its
    values depend only on ``seed``, ``table.name`` and the global rows and columns it covers.
    """
    rows, cols = out.shape
    if rows == 0 or cols == 0:
        return
    first, last = row_offset // ROW_BLOCK, (row_offset + rows - 1) // ROW_BLOCK
    for block in range(first, last + 1):
        start = block * ROW_BLOCK
        count = min(ROW_BLOCK, table.num_embeddings - start)
        values = _draw(table, seed, block, count)
        lo, hi = max(start, row_offset), min(start + count, row_offset + rows)
        piece = values[lo - start : hi - start, col_offset : col_offset + cols]
        out[lo - row_offset : hi - row_offset].copy_(piece)
