"""``torchrec.distributed.logger`` at rectrain's path: the named loggers TorchRec's code logs through.

TorchRec routes them to its own handlers (rank-0 only, every rank, rate-capped); here each is a standard
``logging`` logger under ``rectrain.distributed``, configured like any other.
"""

import logging

static_logger = logging.getLogger("rectrain.distributed.static")  # TorchRec: rank 0 only
all_rank_logger = logging.getLogger("rectrain.distributed.all_ranks")
capped_logger = logging.getLogger("rectrain.distributed.capped")  # TorchRec: at most 10 lines per call site

__all__: list[str] = []
