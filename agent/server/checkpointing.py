"""The agent daemon's side of checkpointing: the journal under ``<work-dir>/meta/journal``, the
boot-id check, the records only the shell keeps, and finding the executors that outlived the
previous agent process.

After a host reboot (the boot id changed) nothing that was running survived and the master will
have given up on the old agent id: the checkpoint is discarded and the agent registers anew.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Mapping
from typing import Final

import structlog
from agora.agent.containers.containerizer import container_name
from agora.agent.core import Delete, Put
from agora.agent.core.checkpoint import AGENT, EXECUTOR
from agora.agent.server.journal import Journal, read_boot_id
from agora.agent.server.processes import sandbox_process_alive
from agora.sdk.ids import ExecutorID, FrameworkID

__all__ = ["Checkpointer", "find_alive", "split_pair_key"]

log = structlog.get_logger(__name__)

_SHELL: Final = "shell"
_BOOT_ID: Final = "boot_id"
_ENDPOINT: Final = "executor_endpoint"

Records = dict[tuple[str, str], bytes]


def split_pair_key(key: str) -> tuple[str, str]:
    """The two ids of a two-part checkpoint key ``f"{len(a)}:{a}/{b}"``; ValueError if bad."""
    size, colon, rest = key.partition(":")
    if not colon or not size.isdigit() or len(rest) <= int(size) or rest[int(size)] != "/":
        raise ValueError(f"bad checkpoint key {key!r}")
    n = int(size)
    return rest[:n], rest[n + 1 :]


class Checkpointer:
    def __init__(self, work_dir: str) -> None:
        self._dir = os.path.join(work_dir, "meta", "journal")
        self._journal: Journal | None = None
        self._dirty = False

    def open(self) -> Records:
        """Open the journal and return what it holds ({} for a fresh agent, or after a reboot)."""
        self._journal = Journal(self._dir)
        records = self._journal.load()
        boot_id = read_boot_id()
        saved = records.get((_SHELL, _BOOT_ID))
        if records and saved is not None and saved.decode(errors="replace") != boot_id:
            log.warning("host_rebooted_checkpoint_discarded", directory=self._dir)
            self.discard()
            self._journal = Journal(self._dir)
            records = self._journal.load()
        self._journal.put(_SHELL, _BOOT_ID, boot_id.encode())
        self._dirty = True
        return records

    @staticmethod
    def recovering(records: Mapping[tuple[str, str], bytes]) -> bool:
        """Whether the records hold an agent to recover (it had an id)."""
        return any(kind == AGENT for kind, _ in records)

    @staticmethod
    def executor_endpoint(records: Mapping[tuple[str, str], bytes]) -> str | None:
        value = records.get((_SHELL, _ENDPOINT))
        return value.decode() if value else None

    @staticmethod
    def executors(records: Mapping[tuple[str, str], bytes]) -> list[tuple[FrameworkID, ExecutorID]]:
        found = []
        for kind, key in records:
            if kind == EXECUTOR:
                fid, eid = split_pair_key(key)
                found.append((FrameworkID(fid), ExecutorID(eid)))
        return sorted(found)

    def record_endpoint(self, endpoint: str) -> None:
        assert self._journal is not None
        self._journal.put(_SHELL, _ENDPOINT, endpoint.encode())
        self._dirty = True

    def save(self, changes: Iterable[Put | Delete]) -> None:
        """Buffer the core's changes; :meth:`commit` makes them durable."""
        journal = self._journal
        if journal is None:
            return
        for change in changes:
            if isinstance(change, Put):
                journal.put(change.kind, change.key, change.value)
            else:
                journal.delete(change.kind, change.key)
            self._dirty = True

    def commit(self) -> None:
        """One fsync for everything saved since the last commit (nothing to do: no I/O)."""
        if self._journal is not None and self._dirty:
            self._journal.commit()
            self._dirty = False

    def discard(self) -> None:
        """Forget the checkpoint (the master forgot this agent: the next start is a new one)."""
        self.close()
        shutil.rmtree(self._dir, ignore_errors=True)

    def close(self) -> None:
        if self._journal is not None:
            self._journal.close()
            self._journal = None


def find_alive(
    work_dir: str, executors: Iterable[tuple[FrameworkID, ExecutorID]]
) -> dict[tuple[FrameworkID, ExecutorID], int]:
    """The checkpointed executors whose process still runs: its pid from ``executor.pid`` in its
    sandbox, alive and started in that sandbox or living in the executor's container (so a
    reused pid is not taken for it)."""
    alive = {}
    for fid, eid in executors:
        sandbox = os.path.join(work_dir, "frameworks", fid, "executors", eid)
        try:
            with open(os.path.join(sandbox, "executor.pid"), encoding="ascii") as f:
                pid = int(f.read().strip())
        except (OSError, ValueError):
            continue
        if pid > 1 and (
            sandbox_process_alive(pid, sandbox)
            or _in_cgroup(pid, container_name(fid, "executor", eid))
        ):
            alive[(fid, eid)] = pid
    return alive


def _in_cgroup(pid: int, name: str) -> bool:
    """``pid`` lives in a cgroup called ``name`` (a contained executor's init, which carries the
    agent's environment rather than the executor's)."""
    try:
        with open(f"/proc/{pid}/cgroup", encoding="utf-8") as f:
            return any(line.rstrip("\n").endswith(f"/{name}") for line in f)
    except OSError:
        return False
