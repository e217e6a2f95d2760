"""Fetching a task's URIs into its sandbox before it starts, as the user it runs as (a local source
that user could not read fails the fetch), through the executor's fetch cache.

Only a task with URIs needs this (and the fetcher's HTTP client, tarfile, zipfile): the command
executor imports this module on the first such task."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Final

from agora.agent.containers.fetcher import Fetcher, FetchError, local_source_problem
from agora.agent.containers.isolation import ContainerConfig
from agora.agent.executors.task_process import RunAs
from agora.sdk.messages import URI

__all__ = ["FetchError", "fetch_into", "fetcher_for"]

#: The fetch cache's size limit when the agent's container settings name none.
_CACHE_MAX: Final = 2 * 1024**3


def fetcher_for(config: ContainerConfig | None, executor_sandbox: str) -> Fetcher:
    """The fetcher of the agent's container settings (their cache, else one in the executor's
    sandbox)."""
    cache = config.fetch_cache if config is not None else None
    cache = cache or os.path.join(executor_sandbox, ".fetch-cache")
    limit = config.fetch_cache_max if config is not None else _CACHE_MAX
    return Fetcher(cache, limit)


async def fetch_into(
    fetcher: Fetcher, sandbox: str, uris: Sequence[URI], run_as: RunAs | None
) -> None:
    """Fetch ``uris`` into ``sandbox`` (made if need be), everything owned by ``run_as``.
    Raises FetchError, OSError."""
    if run_as is not None:
        for uri in uris:
            problem = local_source_problem(uri, run_as.uid, run_as.gid, run_as.groups)
            if problem is not None:
                raise FetchError(problem)
    os.makedirs(sandbox, exist_ok=True)
    if run_as is not None:
        os.chown(sandbox, run_as.uid, run_as.gid)
    await fetcher.fetch_all(uris, sandbox)
    if run_as is not None:
        for root, dirs, files in os.walk(sandbox):
            for name in dirs + files:
                os.lchown(os.path.join(root, name), run_as.uid, run_as.gid)
