"""This master's place in the election group: the Raft member, the registry replica and, while it
leads, the master core of its term.

Every master applies committed registry operations to its own replica. A master that wins an
election becomes *active* only once the no-op its Raft core appends in the new term is committed
and applied here: from then on its replica holds every change any earlier leader committed, and a
fresh :class:`Master` core is made from it with ``epoch`` = the term. Losing the lead drops that
core: frameworks, tasks and offers are soft state, rebuilt by the next leader from re-registering
agents and re-subscribing frameworks.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import structlog
from agora.master.core import Master, MasterConfig
from agora.master.election.node import ElectionNode, NotLeader, Reply
from agora.master.election.storage import RaftStorage
from agora.master.election.types import RaftConfig, Role
from agora.master.registry import Operation, Registry, decode_operation, encode_operation
from agora.sdk.daemon.history import History
from agora.sdk.errors import ProtocolError
from agora.sdk.messages import LeaderInfo, LogEntry, MasterMember, Message
from agora.sdk.transport import CurveClient

__all__ = ["Leadership"]

log = structlog.get_logger(__name__)

#: How long a registry change may take to commit before the core gives it up.
PROPOSE_TIMEOUT = 5.0


class Leadership:
    """Create, ``await start()``, feed peer messages to :meth:`receive`; ``await stop()``."""

    def __init__(
        self,
        config: MasterConfig,
        raft: RaftConfig,
        work_dir: Path,
        *,
        on_change: Callable[[], None],
        history: History,
        curve: CurveClient | None = None,
        source_host: str | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``on_change`` runs whenever :attr:`core` appears or goes (activation, lost lead).
        ``clock``: the monotonic clock the election and its lease run on."""
        self._config = config
        self._raft = raft
        self._on_change = on_change
        self._history = history
        self.registry = Registry()
        self.core: Master | None = None
        self._recorded_term = -1
        self._heard: tuple[int, str | None] = (0, None)
        self.node = ElectionNode(
            raft,
            RaftStorage(work_dir / "raft"),
            apply=self._apply,
            restore=self._restore,
            take_snapshot=self.registry.snapshot,
            on_role=self._on_role,
            source_host=source_host,
            curve=curve,
            clock=clock,
        )

    @property
    def me(self) -> str:
        return self._raft.node_id

    async def start(self) -> None:
        await self.node.start()
        self._note_term(self.node.term)
        if self.node.last_applied and self._history.enabled:
            self._history.record("snapshot", index=self.node.last_applied)

    async def stop(self) -> None:
        await self.node.stop()
        self.core = None

    def receive(self, message: Message, reply: Reply | None = None) -> None:
        """An election message off the master's socket; ``reply``: the way back to its sender
        over the connection it came in on."""
        self.node.receive(message, reply)

    def about_to_lead(self) -> bool:
        """Not active yet, but will be in a moment without anyone else's say: this master won
        its election and waits for its no-op to apply, or it is a group of one."""
        return self.core is None and (
            self.node.role is Role.LEADER or self._raft.members == (self.me,)
        )

    def leading(self) -> bool:
        """Whether this master leads *now*: the one predicate behind everything that acts as the
        leader or says it is one (``/health``, ``/state``, ``agora_master_elected``, LEADER_INFO,
        redirects). It is active in its term (:attr:`core`), still the Raft leader, not halted,
        and its lease holds on the monotonic clock. A leader that was stopped (SIGSTOP) or
        starved past its lease is not leading the moment it runs again, even before it has heard
        that another was elected; a healthy one renews its lease with every heartbeat."""
        return self.core is not None and self.node.lease_valid()

    def lease_until_ns(self) -> int:
        """Monotonic ns at which the current lease ends (now, if there is none)."""
        until = self.node.lease_until()
        return int(until * 1e9) if until is not None else time.monotonic_ns()

    async def propose(self, op: Operation) -> bool:
        """Replicate ``op``; True once committed and applied here, False if it may not be."""
        # Well past the time a leader cut off from its group keeps leading (CheckQuorum steps
        # it down after T): a change given up here is then almost surely not committed later.
        timeout = max(PROPOSE_TIMEOUT, 4 * self._raft.election_timeout)
        try:
            await self.node.propose(encode_operation(op), timeout=timeout)
        except (NotLeader, TimeoutError) as exc:
            log.warning("registry_change_not_committed", op=type(op).__name__, why=str(exc))
            return False
        return True

    # ------------------------------------------------------------------ answering clients

    def leader_info(self) -> LeaderInfo:
        """What this master tells a client about the leader: itself only while :meth:`leading`
        (not before its term is active, nor while its lease has lapsed: then no one)."""
        node = self.node
        if node.role is Role.LEADER:
            leader = self.me if self.leading() else None
        else:
            leader = node.leader_id
        return LeaderInfo(
            responder=self.me, leader=leader, epoch=node.term, masters=self._raft.members
        )

    def members(self) -> tuple[MasterMember, ...]:
        status = self.node.status()
        leader = status.leader
        if leader == self.me and not self.leading():
            leader = None
        out = []
        for member in status.members:
            leads = member.member == leader
            out.append(
                MasterMember(
                    address=member.member,
                    role="leader" if leads else "standby",
                    reachable=member.reachable,
                    last_contact=0.0 if member.member == self.me else member.since_heard,
                )
            )
        return tuple(out)

    # ------------------------------------------------------------------ Raft callbacks

    def _on_role(self, role: Role, term: int, leader: str | None) -> None:
        self._note_term(term)
        history = self._history
        if role is Role.LEADER:
            history.record("leader", term=term)
        elif self.core is not None:
            log.warning("leadership_lost", term=term, leader=leader)
            history.record("stepped_down", term=term)
            self.core = None
            self._on_change()
        if leader is not None and leader != self.me and self._heard != (term, leader):
            self._heard = (term, leader)
            history.record("heard_leader", term=term, leader=leader)

    def _note_term(self, term: int) -> None:
        if term != self._recorded_term:
            self._recorded_term = term
            self._history.record("term", term=term)

    def _apply(self, entry: LogEntry) -> None:
        self.registry.applied_index = entry.index
        if self._history.enabled:
            digest = hashlib.blake2b(entry.data, digest_size=8).hexdigest()
            self._history.record("commit", term=entry.term, index=entry.index, digest=digest)
        if entry.data:
            try:
                op = decode_operation(entry.data)
            except ProtocolError as exc:
                # Every replica skips the same entry, so they stay identical.
                log.error("registry_entry_unreadable", index=entry.index, error=str(exc))
                return
            self.registry.apply(op)
            return
        node = self.node
        if node.role is Role.LEADER and entry.term == node.term and self.core is None:
            self._activate(entry.term)

    def _activate(self, term: int) -> None:
        config = replace(self._config, epoch=term, replicated=True)
        self.core = Master(config, registry=self.registry, now=time.time())
        log.info(
            "leader_active",
            term=term,
            agents_expected=len(self.registry.admitted()),
            frameworks_known=len(self.registry.frameworks),
        )
        self._on_change()

    def _restore(self, data: bytes) -> None:
        self.registry.restore(data)
