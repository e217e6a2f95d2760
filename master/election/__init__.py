"""Leader election and the replicated registry log among the masters (Raft)."""
