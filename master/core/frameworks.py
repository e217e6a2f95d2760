"""Scheduler connections: subscribe, re-subscribe, disconnect, failover timeout, teardown."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

from agora.master.allocator import AllocatorError
from agora.master.core.actions import Peer
from agora.master.core.offers import close_offer
from agora.master.core.state import AgentStatus, Framework, MasterState
from agora.master.registry import FrameworkEntry, RemoveFramework, UpsertFramework
from agora.sdk.ids import AgentID, FrameworkID
from agora.sdk.messages import (
    Error,
    ErrorCode,
    FrameworkCapability,
    FrameworkInfo,
    KillTask,
    Reason,
    Request,
    Revive,
    ShutdownFramework,
    Subscribe,
    Subscribed,
    Suppress,
    TaskState,
    is_terminal,
)
from msgspec.structs import replace

__all__ = [
    "FAILED_OVER",
    "authorized",
    "disconnect",
    "expire_failovers",
    "on_request",
    "on_revive",
    "on_subscribe",
    "on_suppress",
    "remove_framework",
]

#: What a scheduler is told when another one takes its framework over.
FAILED_OVER: Final = "framework failed over to another scheduler"
_ROLE = re.compile(r"^(\*|[A-Za-z0-9_][A-Za-z0-9_.\-]*)$")


def authorized(st: MasterState, sender: Peer, framework_id: FrameworkID) -> Framework | None:
    """The framework a call acts for, if ``sender`` is its subscribed connection.

    Otherwise answers the sender with a typed ERROR and returns ``None``: a call
    before SUBSCRIBED, for an unknown or removed framework, or from a connection
    other than the subscribed one changes nothing.
    """
    fw = st.frameworks.get(framework_id)
    if fw is None or framework_id in st.removing_frameworks:
        if fw is not None or framework_id in st.removed_frameworks:
            _error(st, sender, ErrorCode.FRAMEWORK_REMOVED, f"framework {framework_id} was removed")
        else:
            _error(
                st, sender, ErrorCode.NOT_SUBSCRIBED, f"framework {framework_id} is not subscribed"
            )
        return None
    if not fw.connected or fw.peer != sender:
        _error(
            st,
            sender,
            ErrorCode.FORBIDDEN,
            f"framework {framework_id} is subscribed on another connection",
        )
        return None
    return fw


def _error(st: MasterState, to: Peer, code: ErrorCode, message: str) -> None:
    st.send(to, Error(message=message, code=code))


def _role_problem(st: MasterState, info: FrameworkInfo) -> str | None:
    if not info.roles:
        return "a framework needs at least one role"
    for role in info.roles:
        if not _ROLE.match(role) or role in (".", ".."):
            return f"invalid role name {role!r}"
        if st.config.roles and role not in st.config.roles and role != "*":
            return f"role {role!r} is not one of this master's roles"
    if len(set(info.roles)) != len(info.roles):
        return "roles must not repeat"
    return None


def on_subscribe(st: MasterState, sender: Peer, msg: Subscribe, now: float) -> None:
    info = msg.framework_info
    problem = _role_problem(st, info)
    if problem is not None:
        _error(st, sender, ErrorCode.BAD_REQUEST, problem)
        return
    requested = info.framework_id
    if requested is not None and requested in st.removed_frameworks:
        _error(st, sender, ErrorCode.FRAMEWORK_REMOVED, f"framework {requested} was removed")
        return
    bad_suppressed = set(msg.suppressed_roles) - set(info.roles)
    if bad_suppressed:
        _error(
            st,
            sender,
            ErrorCode.BAD_REQUEST,
            f"suppressed roles {sorted(bad_suppressed)} are not the framework's",
        )
        return

    if requested is not None:
        owner = _owner(st, requested)
        if owner is not None and info.principal != owner:
            # A framework belongs to the principal that registered it: no one else may take it
            # over (its scheduler keeps it), as in Mesos.
            st.notice(
                "subscribe_refused",
                warning=True,
                framework_id=requested,
                principal=info.principal,
                owner=owner,
            )
            why = f"framework {requested} belongs to another principal"
            _error(st, sender, ErrorCode.FORBIDDEN, why)
            return
    if requested is None:
        known = st.frameworks_by_peer.get(sender)
        if known is not None and st.frameworks[known].connected:
            # A SUBSCRIBE retried because SUBSCRIBED was lost: the framework already subscribed
            # on this connection subscribes again, same id (Mesos resends the acknowledgement).
            # A second framework on one connection would go on receiving offers nobody answers.
            _resubscribe(st, sender, st.frameworks[known], msg, now)
            return
    existing = st.frameworks.get(requested) if requested is not None else None
    if existing is not None:
        _resubscribe(st, sender, existing, msg, now)
        return
    if sender in st.subscribing_peers or requested in st.busy_frameworks:
        return  # a retry while its registration commits: SUBSCRIBED comes with the commit
    # A new framework, or (after a master failover) a known id this master has not seen yet.
    framework_id = requested if requested is not None else FrameworkID(st.mint("F"))
    info = _with_id(info, framework_id)
    entry = _entry(info, framework_id)
    if st.registry.frameworks.get(framework_id) == entry:
        _add(st, sender, framework_id, info, msg, now)  # back after a failover, unchanged
        return
    st.subscribing_peers[sender] = framework_id
    st.busy_frameworks.add(framework_id)

    def registered(now: float) -> None:
        gone = st.subscribing_peers.get(sender) != framework_id  # disconnected meanwhile
        _settled()
        if st.registry.is_removed_framework(framework_id):
            _error(st, sender, ErrorCode.FRAMEWORK_REMOVED, f"framework {framework_id} was removed")
            return
        _add(st, sender, framework_id, info, msg, now)
        if gone:
            disconnect(st, sender, now)  # its failover clock starts now, as for any other

    def _settled() -> None:
        st.subscribing_peers.pop(sender, None)
        st.busy_frameworks.discard(framework_id)

    st.propose(UpsertFramework(framework=entry), registered, _settled, now=now)


def _owner(st: MasterState, framework_id: FrameworkID) -> str | None:
    """The principal a framework belongs to: the one it registered with (None: none known)."""
    fw = st.frameworks.get(framework_id)
    if fw is not None:
        return fw.info.principal
    entry = st.registry.frameworks.get(framework_id)
    return entry.principal if entry is not None else None


def _entry(info: FrameworkInfo, framework_id: FrameworkID) -> FrameworkEntry:
    """What the registry keeps of a framework: enough to honour its failover timeout."""
    return FrameworkEntry(
        framework_id=framework_id,
        name=info.name[:255],
        roles=info.roles,
        failover_timeout=info.failover_timeout,
        principal=info.principal,
    )


def _add(
    st: MasterState,
    sender: Peer,
    framework_id: FrameworkID,
    info: FrameworkInfo,
    msg: Subscribe,
    now: float,
) -> None:
    st.absent_frameworks.pop(framework_id, None)
    fw = Framework(framework_id=framework_id, info=info, peer=sender, subscribed_at=now)
    # Tasks reported by re-registered agents before the framework came back.
    st.claim_tasks(fw)
    _bind_peer(st, fw, sender)
    st.frameworks[framework_id] = fw
    st.allocator.add_framework(
        framework_id,
        info.roles,
        now,
        suppressed_roles=msg.suppressed_roles,
        revocable=FrameworkCapability.REVOCABLE_RESOURCES in info.capabilities,
    )
    st.full_allocation_due = True
    st.send(sender, _subscribed(st, framework_id))


def _resubscribe(st: MasterState, sender: Peer, fw: Framework, msg: Subscribe, now: float) -> None:
    if set(msg.framework_info.roles) != set(fw.info.roles):
        problem = "changing a framework's roles on re-subscription is not supported"
        _error(st, sender, ErrorCode.BAD_REQUEST, problem)
        return
    old_peer = fw.peer
    if old_peer is not None and old_peer != sender and fw.connected:
        # The new scheduler replaces the old one (one subscription per framework).
        replaced = Error(message=FAILED_OVER, code=ErrorCode.FORBIDDEN)
        st.send(old_peer, replaced)
    # Offers made to the previous connection are no longer meaningful.
    for offer_id in sorted(fw.offers):
        close_offer(st, offer_id, now)
    fw.info = _with_id(msg.framework_info, fw.framework_id)
    entry = _entry(fw.info, fw.framework_id)
    if st.registry.frameworks.get(fw.framework_id) != entry:
        st.propose(UpsertFramework(framework=entry), now=now)  # e.g. a new failover timeout
    fw.disconnected_at = None
    if sender != old_peer:
        fw.failovers += 1  # a new connection (a scheduler restarted or moved) took over
    _bind_peer(st, fw, sender)
    # A suppressed role stays suppressed across re-subscription; the call may add more.
    if msg.suppressed_roles:
        st.allocator.suppress(fw.framework_id, msg.suppressed_roles)
    st.allocator.set_framework_active(fw.framework_id, True)
    st.allocator.set_framework_revocable(
        fw.framework_id, FrameworkCapability.REVOCABLE_RESOURCES in fw.info.capabilities
    )
    st.full_allocation_due = True
    st.send(sender, _subscribed(st, fw.framework_id))


def _bind_peer(st: MasterState, fw: Framework, peer: Peer) -> None:
    if fw.peer is not None and st.frameworks_by_peer.get(fw.peer) == fw.framework_id:
        del st.frameworks_by_peer[fw.peer]
    fw.peer = peer
    st.frameworks_by_peer[peer] = fw.framework_id


def _with_id(info: FrameworkInfo, framework_id: FrameworkID) -> FrameworkInfo:
    return replace(info, framework_id=framework_id)


def _subscribed(st: MasterState, framework_id: FrameworkID) -> Subscribed:
    return Subscribed(
        framework_id=framework_id,
        heartbeat_interval_seconds=st.config.heartbeat_interval,
        master_info=st.master_info,
    )


def disconnect(st: MasterState, peer: Peer, now: float) -> None:
    """The scheduler on ``peer`` went away: deactivate it and start its failover clock."""
    st.subscribing_peers.pop(peer, None)  # its registration, if committing, will see it gone
    framework_id = st.frameworks_by_peer.pop(peer, None)
    if framework_id is None:
        return
    fw = st.frameworks[framework_id]
    fw.disconnected_at = now
    st.allocator.set_framework_active(framework_id, False)
    for offer_id in sorted(fw.offers):
        close_offer(st, offer_id, now)
    if fw.info.failover_timeout <= 0:
        remove_framework(st, fw, now, reason="its scheduler disconnected and failover_timeout is 0")


def expire_failovers(st: MasterState, now: float) -> None:
    for fw in list(st.frameworks.values()):
        since = fw.disconnected_at
        timeout = fw.info.failover_timeout
        if since is not None and now - since >= timeout:
            why = f"its scheduler stayed disconnected past failover_timeout ({timeout:g} s)"
            remove_framework(st, fw, now, reason=why)
    for framework_id, deadline in list(st.absent_frameworks.items()):
        if now >= deadline:
            why = (
                f"it did not re-subscribe within {now - st.leader_since:g} s of the leader change"
                f" (re-subscription window {st.config.resubscribe_window:g} s + failover_timeout)"
            )
            remove_absent(st, framework_id, now, reason=why)


def remove_absent(
    st: MasterState,
    framework_id: FrameworkID,
    now: float,
    *,
    reason: str,
    done: Callable[[], object] | None = None,
    abandon: Callable[[], object] | None = None,
) -> None:
    """A registry framework that did not come back after a failover (within its failover
    timeout, or before an operator tore it down): retire its id and kill what the re-registered
    agents still run for it. ``done`` runs once that is committed, ``abandon`` if it cannot be."""
    if framework_id in st.busy_frameworks:
        return
    st.busy_frameworks.add(framework_id)
    entry = st.registry.frameworks.get(framework_id)
    name = entry.name if entry is not None else ""

    def removed(now: float) -> None:
        st.busy_frameworks.discard(framework_id)
        st.absent_frameworks.pop(framework_id, None)
        if done is not None:
            done()
        if framework_id in st.frameworks:
            return  # it came back meanwhile (only possible while this was committing)
        agents_with_tasks: set[AgentID] = set()
        for key in sorted(st.unclaimed_tasks.get(framework_id, ())):
            task = st.tasks[key]
            agents_with_tasks.add(task.agent_id)
            if not is_terminal(task.state):
                kill = KillTask(framework_id=framework_id, task_id=key[1], kill_id=st.mint("K"))
                st.send_agent(task.agent_id, kill)
            st.release_task(task, now)
            st.forget_task(key)
        for agent in st.agents.values():
            for exec_key in [k for k in agent.executors if k[0] == framework_id]:
                info, role = agent.executors.pop(exec_key)
                st.recover(framework_id, agent.agent_id, role, info.resources, now)
                agents_with_tasks.add(agent.agent_id)
        for agent_id in sorted(agents_with_tasks):
            st.send_agent(agent_id, ShutdownFramework(framework_id=framework_id))
            st.dirty_agents.add(agent_id)
        st.removed_frameworks.add(framework_id)
        st.notice(
            "framework_removed", warning=True, framework_id=framework_id, name=name, reason=reason
        )

    def given_up() -> None:
        st.busy_frameworks.discard(framework_id)
        if abandon is not None:
            abandon()

    st.propose(RemoveFramework(framework_id=framework_id), removed, given_up, now=now)


def remove_framework(
    st: MasterState,
    fw: Framework,
    now: float,
    *,
    reason: str,
    done: Callable[[], object] | None = None,
    abandon: Callable[[], object] | None = None,
) -> None:
    """Tear a framework down once the registry has retired its id: its offers go, its tasks are
    killed. Until that commits the framework stays as it is (deactivated if disconnected).
    ``done`` runs once it is removed, ``abandon`` if the removal cannot commit."""
    framework_id = fw.framework_id
    if framework_id in st.busy_frameworks:
        return
    st.busy_frameworks.add(framework_id)
    st.removing_frameworks.add(framework_id)

    def settled() -> None:
        st.busy_frameworks.discard(framework_id)
        st.removing_frameworks.discard(framework_id)

    def removed(now: float) -> None:
        settled()
        current = st.frameworks.get(framework_id)
        if current is not None:
            _remove_now(st, current, now)
            st.notice(
                "framework_removed",
                warning=True,
                framework_id=framework_id,
                name=current.info.name,
                reason=reason,
            )
        if done is not None:
            done()

    def given_up() -> None:
        settled()
        if abandon is not None:
            abandon()

    st.propose(RemoveFramework(framework_id=framework_id), removed, given_up, now=now)


def _remove_now(st: MasterState, fw: Framework, now: float) -> None:
    for offer_id in sorted(fw.offers):
        close_offer(st, offer_id, now)
    agents_with_tasks: set[AgentID] = set()
    for key in sorted(fw.tasks):
        task = st.tasks.get(key)
        if task is None:
            continue
        agents_with_tasks.add(task.agent_id)
        if not is_terminal(task.state):
            kill = KillTask(framework_id=fw.framework_id, task_id=key[1], kill_id=st.mint("K"))
            st.send_agent(task.agent_id, kill)
            st.set_task_state(task, TaskState.KILLED)
            status = st.master_status(
                key[1], TaskState.KILLED, Reason.FRAMEWORK_REMOVED, now, agent_id=task.agent_id
            )
            st.set_status(task, status)
        st.forget_task(key, kept=True)
        st.keep_completed(fw, task)
    for agent in st.agents.values():
        for exec_key in [k for k in agent.executors if k[0] == fw.framework_id]:
            del agent.executors[exec_key]
            agents_with_tasks.add(agent.agent_id)
    for agent_id in sorted(agents_with_tasks):
        holder = st.agents.get(agent_id)
        if holder is not None and holder.status is AgentStatus.ACTIVE:
            st.send_agent(agent_id, ShutdownFramework(framework_id=fw.framework_id))
            st.dirty_agents.add(agent_id)
    # The allocator releases everything the framework held (offers, tasks, executors).
    st.allocator.remove_framework(fw.framework_id)
    if fw.peer is not None and st.frameworks_by_peer.get(fw.peer) == fw.framework_id:
        del st.frameworks_by_peer[fw.peer]
    del st.frameworks[fw.framework_id]
    st.removed_frameworks.add(fw.framework_id)
    st.keep_removed(fw)


def on_suppress(st: MasterState, fw: Framework, msg: Suppress) -> None:
    roles = msg.roles or fw.info.roles
    st.allocator.suppress(fw.framework_id, roles)


def on_revive(st: MasterState, fw: Framework, msg: Revive) -> None:
    roles = msg.roles or fw.info.roles
    st.allocator.revive(fw.framework_id, roles)
    st.full_allocation_due = True


def on_request(st: MasterState, sender: Peer, fw: Framework, msg: Request, now: float) -> None:
    for gang in msg.gangs:
        if gang.role not in fw.info.roles:
            _error(
                st,
                sender,
                ErrorCode.BAD_REQUEST,
                f"gang {gang.gang_id}: role {gang.role!r} is not the framework's",
            )
            continue
        try:
            st.allocator.request_gang(fw.framework_id, gang, now)
        except AllocatorError as e:
            _error(st, sender, ErrorCode.BAD_REQUEST, f"gang {gang.gang_id}: {e}")
            continue
        st.full_allocation_due = True
