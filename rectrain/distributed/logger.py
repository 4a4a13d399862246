"""``torchrec.distributed.logger`` at rectrain's path: the named loggers TorchRec's code logs through, and
TorchRec's method logger.

TorchRec routes its loggers to handlers registered per destination (``logging_handlers._log_handlers``) and
stops them propagating; here each is a standard ``logging`` logger under ``rectrain.distributed``,
configured like any other, with TorchRec's caps kept as filters (``capped_logger`` 10 lines per call site,
``one_time_logger`` one, ``one_time_rank0_logger`` one and on rank 0 only). ``_get_or_create_logger`` builds
a logger TorchRec's way for a destination whose handler a user registered.
"""

import functools
import inspect
import logging
from collections import Counter
from collections.abc import Callable
from typing import Any, TypeVar

from torch import distributed as dist

from rectrain.distributed.logging_handlers import _log_handlers

ARG_SIZE_LIMIT = 800000  # longer arguments are logged by their size only
_T = TypeVar("_T")
_FORMAT = "%(asctime)s %(filename)s:%(lineno)s %(levelname)s p:%(processName)s t:%(threadName)s: %(message)s"


class LazyStr:
    """A message computed on first ``str()`` (so only when a handler formats it), then kept."""

    __slots__ = ("_fn", "_str")

    def __init__(self, fn: Callable[[], str]) -> None:
        self._fn, self._str = fn, None

    def __str__(self) -> str:
        if self._str is None:
            self._str = self._fn()
        return self._str


class _Cap(logging.Filter):
    """At most ``limit`` records per call site (and, with ``rank0``, none off rank 0)."""

    def __init__(self, limit: int, rank0: bool = False) -> None:
        super().__init__()
        self.limit, self.rank0, self.seen = limit, rank0, Counter[tuple[str, int]]()

    def filter(self, record: logging.LogRecord) -> bool:
        if self.rank0 and dist.is_initialized() and dist.get_rank() != 0:
            return False
        self.seen[record.pathname, record.lineno] += 1
        return self.seen[record.pathname, record.lineno] <= self.limit


def _named(name: str, cap: _Cap | None = None) -> logging.Logger:
    logger = logging.getLogger(f"rectrain.distributed.{name}")
    if cap is not None and not logger.filters:
        logger.addFilter(cap)
    return logger


static_logger = _named("static")  # TorchRec: rank 0 only
all_rank_logger = _named("all_ranks")
capped_logger = _named("capped", _Cap(10))
one_time_logger = _named("one_time", _Cap(1))
one_time_rank0_logger = _named("one_time_rank0", _Cap(1, rank0=True))
method_logger = _named("method")
unfiltered_logger = _named("unfiltered")


def _get_logging_handler(destination: str) -> logging.Handler:
    return _log_handlers[destination]


def _get_or_create_logger(destination: str) -> logging.Logger:
    """TorchRec's logger for ``destination``: DEBUG, not propagating, with the destination's handler."""
    handler = _get_logging_handler(destination)
    logger = logging.getLogger(f"{destination}-{handler.__class__.__name__}")
    logger.setLevel(logging.DEBUG)
    handler.setFormatter(logging.Formatter(_FORMAT))
    logger.propagate = False
    if not logger.handlers:
        logger.addHandler(handler)
    return logger


def _get_msg_dict(func_name: str, **kwargs: Any) -> dict[str, Any]:
    """The call's name and, under ``torch.distributed``, its group (``group=`` or ``process_group=``),
    world size and rank."""
    try:
        msg = {"func_name": func_name}
        if dist.is_initialized():
            group = kwargs.get("group") or kwargs.get("process_group")
            msg.update(
                group=f"{group}", world_size=f"{dist.get_world_size(group)}", rank=f"{dist.get_rank(group)}"
            )
        return msg
    except Exception as error:  # logging must never break the call it describes
        logging.error(f"Torchrec Logger: Error in _get_msg_dict: {error}")
        return {"_get_msg_dict_error": str(error)}


def _get_input_from_func(
    func: Callable[..., Any], msg_dict: dict[str, Any], *args: Any, **kwargs: Any
) -> str:
    """The call's arguments by name, defaults filled (numbers as they are, the rest as strings); an
    ``__init__`` call's ``func_name`` in ``msg_dict`` gains the class name."""
    try:
        signature = inspect.signature(func)
        bound = signature.bind_partial(*args, **kwargs)
        bound.apply_defaults()
        values = {p.name: p.default for p in signature.parameters.values()}
        for key, value in bound.arguments.items():
            if key == "self" and func.__name__ == "__init__":
                msg_dict["func_name"] = f"{value.__class__.__name__}.{msg_dict['func_name']}"
            text = None if isinstance(value, (int, float)) else str(value)
            if text is not None and len(text) > ARG_SIZE_LIMIT:
                text = f"Argument removed due to size limit. Original size: {len(text)}"
            values[key] = value if text is None else text
        return str(values)
    except Exception as error:  # logging must never break the call it describes
        logging.error(f"Torchrec Logger: Error in _get_input_from_func: {error}")
        return "Error in _get_input_from_func: " + str(error)


def _torchrec_method_logger(**wrapper_kwargs: Any) -> Callable[[Callable[..., _T]], Callable[..., _T]]:
    """Logs each call to ``method_logger``: its inputs and output (info), or its inputs and error (error)."""

    def decorator(func: Callable[..., _T]) -> Callable[..., _T]:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> _T:
            msg = _get_msg_dict(func.__name__, **kwargs)
            try:
                result = func(*args, **kwargs)
            except BaseException as error:
                msg["error"] = f"{error}"
                msg["input"] = _get_input_from_func(func, msg, *args, **kwargs)
                method_logger.error(msg)
                raise
            try:
                msg["input"] = _get_input_from_func(func, msg, *args, **kwargs)
                msg["output"] = str(result)
                method_logger.info(msg)
            except Exception as error:  # logging must never break the call it describes
                unfiltered_logger.fatal(f"Torchrec logger: Failed in method_logger: {error}")
            return result

        return wrapper

    return decorator


__all__: list[str] = []
