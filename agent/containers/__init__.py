"""Containers: the isolators an agent composes (cgroups, namespaces, root filesystems), the image
store, the fetcher and GPU discovery. Used by the agent daemon (custom executors' containers) and
the built-in executor (one container per command task)."""
