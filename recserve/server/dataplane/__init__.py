"""The transport-agnostic data plane: check, batch, predict and split scores, per model version."""
