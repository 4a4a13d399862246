"""Sharded modules: the sharded collections, their tables, lookups, weights, optimizer and torch state."""
