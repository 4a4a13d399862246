"""Exception types of the training half. Callers branch on these; messages name the field and the fix."""


class RecTrainError(Exception):
    """Base of every error rectrain raises on purpose."""


class ConfigError(RecTrainError, ValueError):
    """A user-supplied value (config field, constructor argument, file) is invalid."""


class TrainingDiverged(RecTrainError):
    """The loss became NaN/inf, or the held-out AUC collapsed to chance; the run stopped without saving."""
