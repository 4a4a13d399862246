"""``torchrec.distributed.logging_handlers``: the destinations of TorchRec's named loggers and their handlers.

``_log_handlers`` maps a destination to the handler ``logger._get_or_create_logger`` attaches (a
``NullHandler`` unless one is registered, as in TorchRec's open-source build).
"""

import logging
from collections import defaultdict

UnfilteredLogger = "UnfilteredLogger"
SingleRankStaticLogger = "SingleRankStaticLogger"
AllRankStaticLogger = "AllRankStaticLogger"
CappedLogger = "CappedLogger"
Cap1Logger = "Cap1Logger"
Cap01Logger = "Cap01Logger"
MethodLogger = "MethodLogger"

_log_handlers: dict[str, logging.Handler] = defaultdict(logging.NullHandler)

__all__: list[str] = []
