"""The planner's exception type: raised when no placement satisfies every rank's memory."""

from rectrain.errors import RecTrainError


class PlannerError(RecTrainError):
    """No plan fits the topology; the message names the table, its size and the shortfall per rank."""
