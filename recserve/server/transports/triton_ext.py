"""Triton's gRPC extensions over recserve's state: model configuration, statistics and the model repository.

What Triton's clients and tools (``tritonclient``'s ``get_model_config``, ``get_inference_statistics``,
``get_model_repository_index``, ``load_model``/``unload_model``; ``perf_analyzer``) read, built from what the
server has: the package's schema, the batcher's settings, :class:`recserve.server.dataplane.stats.ModelStats`.

The model configuration follows Triton's conventions: ``max_batch_size`` is the server's ``--max-batch-size``
(examples per request and per batch), so every input's ``dims`` leave out the leading batch dimension that
ModelMetadata shows as -1. The ids (``<feature>.values``) and their weights lead with the number of ids, not
of examples, and the batcher concatenates them request after request: Triton's ``allow_ragged_batch`` says
that.
"""

from __future__ import annotations

import logging
from pathlib import Path

from recserve.errors import (
    InvalidRequestError,
    ModelNotFoundError,
    PermissionDeniedError,
    UnauthenticatedError,
    UnavailableError,
)
from recserve.server.dataplane.core import InferenceCore
from recserve.server.dataplane.runner import ModelRunner
from recserve.server.dataplane.stats import BatchStages, Duration, StatsSnapshot
from recserve.server.operations.admin import AUTH_METADATA_KEY, bearer_matches
from recserve.server.operations.control import ModelControl
from recserve.server.transports.protos import oip_pb2

logger = logging.getLogger(__name__)

PLATFORM = "recserve_fbgemm"
EXTENSIONS = ("binary_tensor_data", "model_configuration", "statistics", "model_repository")
_DATA_TYPES = {"FP32": oip_pb2.TYPE_FP32, "INT32": oip_pb2.TYPE_INT32, "INT64": oip_pb2.TYPE_INT64}
_RAGGED_ROLES = ("values", "weights")
POLLING_REFUSAL = (
    "explicit model load / unload is not allowed if polling is enabled (the server runs with --watch: "
    "add or remove version directories instead)"
)
CONTROL_OFF = (
    "model control is off on the serving port (--model-control none, the default): load or reload through "
    "the admin service (`recserve query --reload`, --admin-port), or start the server with --model-control "
    "explicit to take repository load/unload here under the admin credentials"
)


def model_config(
    runner: ModelRunner, inputs: list[tuple[str, str, list[int]]], device: str = "cpu"
) -> oip_pb2.ModelConfig:
    """A Triton-shaped config of the served version; ``inputs`` as ModelMetadata lists them."""
    s = runner.schema
    bc = runner.batcher.config
    cfg = oip_pb2.ModelConfig(name=s.model_name, platform=PLATFORM, backend="recserve")
    cfg.max_batch_size = s.max_batch_size
    cfg.version_policy.latest.num_versions = 1
    for name, dtype, shape in inputs:
        role = name.rsplit(".", 1)[-1]
        cfg.input.add(
            name=name,
            data_type=_DATA_TYPES[dtype],
            dims=shape[1:],
            allow_ragged_batch=role in _RAGGED_ROLES,
            optional=role == "weights",
        )
    cfg.output.add(name="scores", data_type=oip_pb2.TYPE_FP32, dims=[])
    group = cfg.instance_group.add(name=f"{s.model_name}_0", count=1)
    if device.startswith("cuda"):
        group.kind = oip_pb2.ModelInstanceGroup.KIND_GPU
        group.gpus.append(int(device.partition(":")[2] or 0))
    else:
        group.kind = oip_pb2.ModelInstanceGroup.KIND_CPU
    db = cfg.dynamic_batching
    db.max_queue_delay_microseconds = int(round(bc.max_queue_delay_s * 1e6))
    db.default_queue_policy.max_queue_size = bc.max_queue_size
    db.default_queue_policy.timeout_action = oip_pb2.ModelQueuePolicy.REJECT
    for key, value in (
        ("model_version", s.version),
        ("dense_in_features", str(s.dense_in_features)),
        ("weighted_features", ",".join(sorted(s.weighted_features))),
    ):
        cfg.parameters[key].string_value = value
    return cfg


def _set(target: oip_pb2.StatisticDuration, d: Duration) -> None:
    target.count, target.ns = d.count, d.ns


def model_statistics(runner: ModelRunner, snap: StatsSnapshot) -> oip_pb2.ModelStatistics:
    """The served version's statistics ``snap`` since its load (:mod:`recserve.server.dataplane.stats`)."""
    name, version = runner.model_id
    out = oip_pb2.ModelStatistics(
        name=name,
        version=version,
        last_inference=snap.last_inference_ms,
        inference_count=snap.inference_count,
        execution_count=snap.execution_count,
    )
    st = out.inference_stats
    _set(st.success, snap.success)
    _set(st.fail, snap.fail)
    _set(st.queue, snap.queue)
    _set_stages(st, snap.requests)
    for size in sorted(snap.batches):
        _set_stages(out.batch_stats.add(batch_size=size), snap.batches[size])
    return out


def _set_stages(target, stages: BatchStages) -> None:
    _set(target.compute_input, stages.compute_input)
    _set(target.compute_infer, stages.compute_infer)
    _set(target.compute_output, stages.compute_output)


class Repository:
    """Triton's model repository extension for a server of one model.

    The repository is the reload root (``--reload-root``, by default the ``--package`` dir's parent): a load
    serves its highest numbered version directory, or the package served last when it has none. Load and
    unload change what every client gets, so on the serving ports they are off unless the server runs with
    ``--model-control explicit`` (Triton's name), and then they need the admin token when one is set. With
    ``--watch`` the watch decides what serves, so they are refused as Triton refuses them when it polls.
    """

    def __init__(
        self,
        core: InferenceCore,
        control: ModelControl,
        root: Path | None,
        *,
        polling: bool,
        explicit: bool = False,
        token: str | None = None,
    ) -> None:
        self._core = core
        self._control = control
        self._root = root
        self._polling = polling
        self._explicit = explicit
        self._token = token

    def index(self, ready_only: bool = False) -> list[oip_pb2.RepositoryIndexResponse.ModelIndex]:
        runner = self._core.current
        entry = oip_pb2.RepositoryIndexResponse.ModelIndex(name=self._core.model_name)
        if runner is not None:
            entry.version, entry.state = runner.schema.version, "READY"
        else:
            entry.state, entry.reason = "UNAVAILABLE", "unloaded"
        return [entry] if entry.state == "READY" or not ready_only else []

    def statistics(self, runner: ModelRunner) -> oip_pb2.ModelStatistics:
        """``runner``'s version's statistics; with several workers, summed over those serving it."""
        return model_statistics(runner, self._control.statistics(*runner.model_id))

    def load(self, model_name: str, parameters, authorization: str | None = None) -> None:
        """``authorization``: the call's ``authorization`` metadata (gRPC) or header (REST), if any."""
        self._check("RepositoryModelLoad", model_name, parameters, authorization, allowed=())
        name, version, swapped = self._control.load_latest(self._root)
        logger.info(
            "repository load of %s: serving version %s%s", name, version, "" if swapped else " (already)"
        )

    def unload(self, model_name: str, parameters, authorization: str | None = None) -> None:
        # tritonclient always sends unload_dependents; our model has no dependents, so it changes nothing.
        self._check(
            "RepositoryModelUnload", model_name, parameters, authorization, allowed=("unload_dependents",)
        )
        self._control.unload()

    def _check(
        self, call: str, model_name: str, parameters, authorization: str | None, allowed: tuple[str, ...]
    ) -> None:
        if self._polling:
            raise UnavailableError(POLLING_REFUSAL)
        if not self._explicit:
            raise PermissionDeniedError(f"{call}: {CONTROL_OFF}")
        if self._token is not None and not bearer_matches(authorization, self._token):
            raise UnauthenticatedError(
                f"{call}: needs '{AUTH_METADATA_KEY}: Bearer <token>' with the server's --admin-token"
            )
        if model_name != self._core.model_name:
            raise ModelNotFoundError(
                f"model_name: {model_name!r} is not in the repository (it holds {self._core.model_name!r})"
            )
        for key in parameters:
            if key in allowed:
                continue
            raise InvalidRequestError(
                f"parameters[{key!r}]: not supported; a load serves the newest version directory as exported"
            )
