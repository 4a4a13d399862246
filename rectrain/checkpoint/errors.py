"""Errors of checkpoint files: callers branch on these to tell a damaged checkpoint from a bad argument."""

from __future__ import annotations

from rectrain.errors import RecTrainError


class CheckpointError(RecTrainError):
    """A checkpoint is missing, incomplete, damaged or does not fit the model; the message names the file."""


class CheckpointMismatchError(CheckpointError, ValueError):
    """The checkpoint is intact but does not fit the model or optimizer it is loaded into."""
