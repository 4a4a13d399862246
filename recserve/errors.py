"""The exception types of the serving half; the gRPC layer maps them to status codes in one place."""


class RecServeError(Exception):
    """Base of every error recserve raises on purpose."""


class InvalidRequestError(RecServeError, ValueError):
    """A request's content is malformed (maps to INVALID_ARGUMENT)."""


class OverloadedError(RecServeError):
    """The server's queue is full (maps to RESOURCE_EXHAUSTED)."""
