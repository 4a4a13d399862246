"""The planner's exception type: raised when no placement satisfies every rank's memory."""

from enum import Enum

from rectrain.errors import RecTrainError


class PlannerErrorType(Enum):
    """Why planning failed (TorchRec's classification)."""

    INSUFFICIENT_STORAGE = "insufficient_storage"
    STRICT_CONSTRAINTS = "strict_constraints"
    PARTITION = "partition"
    OTHER = "other"
    PLANNER_INPUT_CONTEXT_MISMATCH = "planner_input_context_mismatch"
    PLAN_LOADING_FAILED = "plan_loading_failed"
    INVALID_RANK_ASSIGNMENT = "invalid_rank_assignment"
    INPUT_VALIDATION = "input_validation"
    MISSING_MODULE_IN_PLAN = "missing_module_in_plan"
    INVALID_COMPUTE_KERNEL = "invalid_compute_kernel"


class PlannerError(RecTrainError):
    """No plan fits the topology; the message names the table, its size and the shortfall per rank."""

    def __init__(self, message: str = "", error_type: PlannerErrorType = PlannerErrorType.OTHER) -> None:
        self.error_type = error_type
        super().__init__(message)
