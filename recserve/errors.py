"""The exception types of the serving half; the gRPC layer maps them to status codes in one place."""


class RecServeError(Exception):
    """Base of every error recserve raises on purpose."""


class InvalidRequestError(RecServeError, ValueError):
    """A request's content is malformed (maps to INVALID_ARGUMENT)."""


class NonFiniteScoresError(InvalidRequestError):
    """A request's inputs drove the model to scores that are not finite (NaN or infinite): the request is
    refused rather than answered with them (maps to INVALID_ARGUMENT)."""


class ModelNotFoundError(RecServeError, LookupError):
    """A request names a model or version the server does not have (maps to NOT_FOUND)."""


class OverloadedError(RecServeError):
    """The server's queue is full (maps to RESOURCE_EXHAUSTED)."""


class PackageError(RecServeError):
    """A model package is missing a file, fails its checksum, or has a manifest that does not parse."""


class ExportError(RecServeError, ValueError):
    """An export request cannot be carried out (bad dtype, table that fits no device, bad checkpoint)."""


class AccuracyError(ExportError):
    """The quantized model loses more accuracy than the export threshold allows (override with --force)."""


class DeadlineExceededError(RecServeError):
    """A request's deadline passed before its batch was computed (maps to DEADLINE_EXCEEDED)."""


class UnavailableError(RecServeError):
    """The server is draining or has no model loaded (maps to UNAVAILABLE)."""


class UnauthenticatedError(RecServeError):
    """An admin call without the admin token (maps to UNAUTHENTICATED)."""


class PermissionDeniedError(RecServeError):
    """An admin call asks for something outside what the server allows, e.g. a path outside its package root
    (maps to PERMISSION_DENIED)."""


class StartupError(RecServeError):
    """The server cannot start as configured: a port that cannot be bound, a path that cannot be used."""
