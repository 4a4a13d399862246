"""Recommend requests in the server: wire arrays -> checked user request -> batched pipeline -> top-k.

Every API (recserve.v1 ``Recommend``, REST, the Open Inference Protocol model) decodes its request into
:class:`FeatureArrays` and calls :class:`RecommendService`: the user's features are checked by the same wire
rules and data checks as a scoring request (:func:`check_request`, errors naming the wire's fields), against
the pipeline's user schema; then the request joins a batch of its own batcher, sized in candidates, and the
batch runs every stage once (:meth:`RecommendPipeline.run`: the ranking model scores all of the batch's
candidates in one call). Each stage's time and each request's candidates go to ``/metrics``.

Admission: a request is refused at once (``OverloadedError``, RESOURCE_EXHAUSTED) when the candidates queued
ahead of it, at the seconds per candidate the recent batches took, would keep it waiting longer than
``max_queued_s``. Under an offered load above capacity the queue then stays short and the requests
answered keep their latency; without it every request would wait out a queue that grows until deadlines.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass

import torch

from recserve.errors import DeadlineExceededError, ModelNotFoundError, OverloadedError
from recserve.recommend.pipeline import Recommendation, RecommendPipeline, UserRequest
from recserve.server.dataplane.arrays import FeatureArrays
from recserve.server.dataplane.batcher import BatcherConfig, DynamicBatcher
from recserve.server.dataplane.validation import ModelSchema, check_request

# A batch holds at most this many candidates (or one request, if a request asks for more).
MAX_BATCH_CANDIDATES = 16_384
_RESULT_GRACE_SECONDS = 1.0
# The longest estimated wait for the work queued ahead of a request before it is refused (see the module's
# docstring; the server's --max-recommend-queued-ms): several batches' worth, so a burst still batches well.
MAX_QUEUED_SECONDS = 0.25
_RATE_WEIGHT = 0.2  # each batch's weight in the moving average of seconds per candidate


@dataclass(frozen=True)
class RecommendResult:
    recommendation: Recommendation
    model_name: str
    model_version: str
    queue_seconds: float
    inference_seconds: float
    executed_batch_size: int  # candidates ranked in the batch


def user_schema(pipeline: RecommendPipeline) -> ModelSchema:
    """What a Recommend request's features must look like: one user, the pipeline's user features."""
    plan = pipeline.plan
    return ModelSchema(
        model_name=pipeline.model_name,
        version=pipeline.version,
        feature_names=list(plan.user_features),
        num_embeddings=torch.tensor([plan.num_embeddings[f] for f in plan.user_features], dtype=torch.int64),
        dense_in_features=plan.user_dense,
        weighted_features=frozenset(),
        max_batch_size=1,
        dense_bounds=pipeline.user_bounds,
    )


class RecommendService:
    """The server's pipeline: ``recommend(arrays, ...)`` blocking, or ``submit`` then ``result``."""

    def __init__(
        self,
        pipeline: RecommendPipeline,
        observer=None,
        *,
        max_queue_delay_s: float = 0.002,
        max_queued_s: float = MAX_QUEUED_SECONDS,
    ) -> None:
        self.pipeline = pipeline
        self.max_queued_s = max_queued_s  # 0: never refuse (the queue is then bounded by deadlines only)
        self._seconds_per_candidate = 0.0  # measured; 0 until the first batch (the server's warm-up)
        self.schema = user_schema(pipeline)
        self._observer = observer
        size = max(MAX_BATCH_CANDIDATES, pipeline.limits.max_candidates)
        config = BatcherConfig(max_batch_size=size, max_queue_delay_s=max_queue_delay_s)
        self._batcher: DynamicBatcher[UserRequest, Recommendation] = DynamicBatcher(
            self._run, config, observer=None, name="recommend-batcher"
        )

    @property
    def model_name(self) -> str:
        return self.pipeline.model_name

    def _run(self, users: list[UserRequest]) -> list[Recommendation]:
        recommendations, times = self.pipeline.run(users)
        if times.candidates:
            rate = sum(times.seconds.values()) / times.candidates
            last = self._seconds_per_candidate
            self._seconds_per_candidate = rate if last == 0 else last + _RATE_WEIGHT * (rate - last)
        if self._observer is not None:
            self._observer.recommend_batch_done(times.seconds, [r.candidates for r in recommendations])
        return recommendations

    def check(
        self,
        arrays: FeatureArrays,
        *,
        k: int = 0,
        num_candidates: int = 0,
        exclude: Sequence[int] | torch.Tensor = (),
        model_name: str = "",
    ) -> UserRequest:
        """The request checked: its model name, its features (named errors), its k, n and exclusions."""
        if model_name and model_name != self.model_name:
            raise ModelNotFoundError(
                f"model_name: {model_name!r} is not a pipeline served here (serving {self.model_name!r})"
            )
        request = check_request(arrays, self.schema)
        users = self.pipeline.check(
            request.dense, request.kjt, k=k, num_candidates=num_candidates, exclude=exclude, checked=True
        )
        return users[0]

    def submit(self, user: UserRequest, deadline: float | None = None) -> Future:
        if self.max_queued_s > 0:
            queued = self._batcher.queued_examples()
            wait = (queued + user.num_candidates) * self._seconds_per_candidate
            if queued and wait > self.max_queued_s:  # an idle server takes any request it can
                raise OverloadedError(
                    f"Recommend: {queued} candidates are queued ahead (about {wait * 1e3:.0f} ms of work, "
                    f"over {self.max_queued_s * 1e3:.0f} ms); retry with backoff"
                )
        return self._batcher.submit(user, size=user.num_candidates, deadline=deadline)

    def result(self, future: Future) -> RecommendResult:
        done = future.result(0)
        return RecommendResult(
            done.result,
            self.model_name,
            self.pipeline.version,
            done.queue_seconds,
            done.inference_seconds,
            done.batch_size,
        )

    def recommend(
        self, user: UserRequest, deadline: float | None = None, now: float = 0.0
    ) -> RecommendResult:
        future = self.submit(user, deadline)
        wait = None if deadline is None else max(0.0, deadline - now) + _RESULT_GRACE_SECONDS
        try:
            future.result(wait)
        except FutureTimeout:
            future.cancel()
            raise DeadlineExceededError(
                "the request's deadline passed while its batch was computed"
            ) from None
        except BaseException:
            pass  # result() re-raises it
        return self.result(future)

    def close(self, timeout: float | None = None) -> None:
        self._batcher.close(timeout)
