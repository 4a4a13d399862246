import logging

import pytest

from rectrain.distributed.logger import (
    LazyStr,
    _torchrec_method_logger,
    capped_logger,
    one_time_logger,
)


def test_capped_loggers_keep_torchrecs_caps_per_call_site(caplog):
    with caplog.at_level("INFO", logger="rectrain.distributed"):
        for i in range(12):
            capped_logger.info("capped %d", i)
            one_time_logger.info("once %d", i)
        one_time_logger.info("another site")
    messages = [r.getMessage() for r in caplog.records]
    assert [m for m in messages if m.startswith("capped")] == [f"capped {i}" for i in range(10)]
    assert [m for m in messages if not m.startswith("capped")] == ["once 0", "another site"]


def test_the_method_logger_logs_inputs_and_output_or_error(caplog):
    @_torchrec_method_logger()
    def scale(x: int, factor: float = 2.0) -> float:
        if x < 0:
            raise ValueError("negative x")
        return x * factor

    with caplog.at_level("INFO", logger="rectrain.distributed.method"):
        assert scale(3) == 6.0
        with pytest.raises(ValueError, match="negative x"):
            scale(-1, factor=0.5)
    ok, failed = (r.msg for r in caplog.records)
    assert ok["func_name"] == "scale" and ok["output"] == "6.0"
    assert ok["input"] == "{'x': 3, 'factor': 2.0}"
    assert failed["error"] == "negative x" and "'factor': 0.5" in failed["input"]
    assert caplog.records[1].levelno == logging.ERROR


def test_lazy_str_is_computed_once_and_only_when_formatted(caplog):
    calls = []
    lazy = LazyStr(lambda: calls.append(1) or "expensive")
    with caplog.at_level("WARNING", logger="rectrain.distributed"):
        logging.getLogger("rectrain.distributed.static").debug(lazy)
    assert calls == []
    assert str(lazy) == str(lazy) == "expensive" and calls == [1]
