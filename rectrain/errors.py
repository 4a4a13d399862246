"""Exception types of the training half. Callers branch on these; messages name the field and the fix."""


class RecTrainError(Exception):
    """Base of every error rectrain raises on purpose."""


class ConfigError(RecTrainError, ValueError):
    """A user-supplied value (config field, constructor argument, file) is invalid."""
