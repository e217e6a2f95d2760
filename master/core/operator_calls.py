"""Operator calls that change the cluster: kill a task, set weights and quota, drain, reactivate
or remove an agent, tear a framework down.

Who may make them is the daemon's decision (its ACL); the core carries them out. A call that
changes the registry takes effect once that change is committed, and only then is it answered
``OPERATOR_DONE``, so an operator who got the answer knows a new leader keeps the change. A call
the core refuses is answered ``ERROR`` and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

from agora.master.allocator.amounts import is_scalar_only
from agora.master.core import agents, frameworks, maintenance, operator_reservations, tasks
from agora.master.core.actions import Peer
from agora.master.core.state import MasterState
from agora.master.registry import DrainAgent as DrainOp
from agora.master.registry import QuotaEntry, RemoveAgent, SetQuota, SetWeights
from agora.sdk._resources_base import valid_role
from agora.sdk.ids import AgentID
from agora.sdk.messages import (
    CancelMaintenance,
    DrainAgent,
    Error,
    ErrorCode,
    Kill,
    MarkAgentGone,
    Message,
    OperatorDone,
    OperatorKill,
    ReactivateAgent,
    ReserveResources,
    ScheduleMaintenance,
    TeardownFramework,
    UnreserveResources,
    UpdateQuota,
    UpdateWeights,
)

__all__ = ["on_operator_call"]


def on_operator_call(st: MasterState, peer: Peer, msg: Message, now: float) -> None:
    """One operator call from ``peer``; answered OPERATOR_DONE once in effect, or ERROR."""
    call = _Call(st, peer, msg)
    if isinstance(msg, OperatorKill):
        _kill(call, msg, now)
    elif isinstance(msg, UpdateWeights):
        _weights(call, msg, now)
    elif isinstance(msg, UpdateQuota):
        _quota(call, msg, now)
    elif isinstance(msg, DrainAgent):
        _drain(call, msg.agent_id, draining=True, now=now, deadline=msg.deadline)
    elif isinstance(msg, ReactivateAgent):
        _drain(call, msg.agent_id, draining=False, now=now)
    elif isinstance(msg, ScheduleMaintenance):
        maintenance.on_schedule(st=call.st, call=call, msg=msg, now=now)
    elif isinstance(msg, CancelMaintenance):
        maintenance.on_cancel(st=call.st, call=call, msg=msg, now=now)
    elif isinstance(msg, MarkAgentGone):
        _gone(call, msg.agent_id, now)
    elif isinstance(msg, TeardownFramework):
        _teardown(call, msg, now)
    elif isinstance(msg, ReserveResources):
        operator_reservations.on_reserve(st, call, msg, now)
    elif isinstance(msg, UnreserveResources):
        operator_reservations.on_unreserve(st, call, msg, now)
    else:
        call.refuse(ErrorCode.BAD_REQUEST, f"{msg.NAME} is not an operator call")


class _Call:
    """The call being answered: its peer and name, and the two ways to answer it."""

    __slots__ = ("msg", "peer", "st")

    def __init__(self, st: MasterState, peer: Peer, msg: Message) -> None:
        self.st, self.peer, self.msg = st, peer, msg

    def done(self, text: str) -> None:
        self.st.send(self.peer, OperatorDone(call=self.msg.NAME, message=text))

    def refuse(self, code: ErrorCode, text: str) -> None:
        self.st.send(self.peer, Error(message=f"{self.msg.NAME}: {text}", code=code))

    def lost(self) -> None:
        """The registry change will not commit under this leader (it lost the lead)."""
        self.refuse(
            ErrorCode.NOT_LEADER,
            "the leader changed before the change was committed; it may still take effect: "
            "check the new leader's state",
        )

    def busy(self, what: str) -> None:
        self.refuse(ErrorCode.BAD_REQUEST, f"a change to {what} is being committed; try again")


def _kill(call: _Call, msg: OperatorKill, now: float) -> None:
    st = call.st
    if msg.framework_id is None:
        candidates = list(st.frameworks.values())
    else:
        one = st.frameworks.get(msg.framework_id)
        candidates = [] if one is None else [one]
    matches = [fw for fw in candidates if (fw.framework_id, msg.task_id) in st.tasks]
    if len(matches) != 1:
        if not matches:
            call.refuse(ErrorCode.UNKNOWN_TASK, f"no live task with id {msg.task_id}")
        else:
            call.refuse(ErrorCode.BAD_REQUEST, f"several frameworks have a task {msg.task_id}")
        return
    fw = matches[0]
    tasks.on_kill(st, fw, Kill(framework_id=fw.framework_id, task_id=msg.task_id), now)
    call.done(f"kill of task {msg.task_id} sent")


def _weights(call: _Call, msg: UpdateWeights, now: float) -> None:
    roles = [w.role for w in msg.weights]
    if not roles:
        call.refuse(ErrorCode.BAD_REQUEST, "no weights given")
        return
    st = call.st
    problem = next((p for r in roles if (p := _role_problem(st, r))), None)
    if problem is not None:
        call.refuse(ErrorCode.BAD_REQUEST, problem)
        return
    if len(set(roles)) != len(roles):
        call.refuse(ErrorCode.BAD_REQUEST, "a role is named twice")
        return

    def committed(_now: float) -> None:
        for w in msg.weights:
            st.allocator.set_weight(w.role, w.weight)
        st.full_allocation_due = True
        call.done("weights set: " + ", ".join(f"{w.role}={w.weight:g}" for w in msg.weights))

    st.propose(SetWeights(weights=msg.weights), committed, call.lost, now=now)


def _quota(call: _Call, msg: UpdateQuota, now: float) -> None:
    st = call.st
    role, guarantee, limit = msg.role, msg.guarantee, msg.limit
    problem = _role_problem(st, role) or ("'*' cannot have a quota" if role == "*" else None)
    if problem is not None:
        call.refuse(ErrorCode.BAD_REQUEST, problem)
        return
    for what, res in (("guarantee", guarantee), ("limit", limit)):
        if res is not None and not is_scalar_only(res):
            call.refuse(ErrorCode.BAD_REQUEST, f"the {what} must be scalars only, got {res}")
            return
    g = guarantee.scalar_totals_milli()
    if limit is not None:
        lim = limit.scalar_totals_milli()
        over = sorted(n for n, v in g.items() if n in lim and v > lim[n])
        if over:
            call.refuse(ErrorCode.BAD_REQUEST, f"guarantee above limit for {', '.join(over)}")
            return
    cleared = not g and limit is None

    def committed(_now: float) -> None:
        st.allocator.set_quota(role, guarantee, limit)
        st.full_allocation_due = True
        call.done(f"quota of {role} removed" if cleared else f"quota of {role} set")

    # A removal is kept as an empty quota, so it also overrides a quota of the master's config
    # when a new leader starts from the registry.
    entry = QuotaEntry(role=role, guarantee=guarantee, limit=limit)
    st.propose(SetQuota(role=role, quota=entry), committed, call.lost, now=now)


def _role_problem(st: MasterState, role: str) -> str | None:
    if not valid_role(role):
        return f"invalid role name {role!r}"
    if st.config.roles and role not in st.config.roles and role != "*":
        return f"role {role!r} is not one of this master's roles"
    return None


def _drain(
    call: _Call, agent_id: AgentID, *, draining: bool, now: float, deadline: float | None = None
) -> None:
    st = call.st
    entry = st.registry.agents.get(agent_id)
    if entry is None:
        call.refuse(ErrorCode.UNKNOWN_AGENT, f"no agent {agent_id} in the cluster")
        return
    verb = "draining" if draining else "active"
    if deadline is not None:
        verb += f" (what runs there at {deadline:.0f} is killed)"
    if entry.draining == draining and (not draining or entry.drain_deadline == deadline):
        call.done(f"agent {agent_id} is already {verb}")
        return
    if agent_id in st.busy_agents:
        call.busy(f"agent {agent_id}")
        return
    st.busy_agents.add(agent_id)

    def committed(now: float) -> None:
        st.busy_agents.discard(agent_id)
        maintenance.set_offering(st, agent_id, offering=not draining, now=now)
        if not draining:
            maintenance.on_reactivated(st, agent_id, now)
        call.done(f"agent {agent_id} is {verb}")

    st.propose(
        DrainOp(agent_id=agent_id, draining=draining, deadline=deadline),
        committed,
        _settle(st, agent_id, call.lost),
        now=now,
    )


def _gone(call: _Call, agent_id: AgentID, now: float) -> None:
    st = call.st
    if agent_id in st.removed_agents or st.registry.is_removed_agent(agent_id):
        call.done(f"agent {agent_id} is already gone")
        return
    if agent_id not in st.agents and agent_id not in st.registry.agents:
        call.refuse(ErrorCode.UNKNOWN_AGENT, f"no agent {agent_id} in the cluster")
        return
    if agent_id in st.busy_agents:
        call.busy(f"agent {agent_id}")
        return
    st.busy_agents.add(agent_id)

    def committed(now: float) -> None:
        st.busy_agents.discard(agent_id)
        st.recovering_agents.discard(agent_id)
        agent = st.agents.get(agent_id)
        if agent is not None:
            agents.remove_by_operator(st, agent, now)
        st.removed_agents.add(agent_id)
        call.done(f"agent {agent_id} is gone")

    st.propose(RemoveAgent(agent_id=agent_id), committed, _settle(st, agent_id, call.lost), now=now)


def _settle(st: MasterState, agent_id: AgentID, then: Callable[[], None]) -> Callable[[], None]:
    def settle() -> None:
        st.busy_agents.discard(agent_id)
        then()

    return settle


def _teardown(call: _Call, msg: TeardownFramework, now: float) -> None:
    st = call.st
    framework_id = msg.framework_id
    if framework_id in st.busy_frameworks:
        call.busy(f"framework {framework_id}")
        return
    fw = st.frameworks.get(framework_id)
    text = f"framework {framework_id} was torn down"
    if fw is not None:

        def removed() -> None:
            # Its scheduler hears why its subscription ended (the SDK driver stops on this).
            if fw.peer is not None and fw.connected:
                why = Error(message=f"{text} by an operator", code=ErrorCode.FRAMEWORK_REMOVED)
                st.send(fw.peer, why)
            call.done(text)

        frameworks.remove_framework(
            st, fw, now, reason="torn down by an operator", done=removed, abandon=call.lost
        )
    elif framework_id in st.absent_frameworks:
        frameworks.remove_absent(
            st,
            framework_id,
            now,
            reason="torn down by an operator",
            done=lambda: call.done(text),
            abandon=call.lost,
        )
    elif framework_id in st.removed_frameworks or st.registry.is_removed_framework(framework_id):
        call.done(f"framework {framework_id} was already removed")
    else:
        call.refuse(ErrorCode.UNKNOWN_FRAMEWORK, f"no framework {framework_id}")
