"""Communication: process groups (ShardingEnv), collectives with autograd, timeouts, the parent lifeline."""
