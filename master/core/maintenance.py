"""Maintenance: windows, inverse offers, drains with a deadline, DRAINED agents.

An operator schedules a window for the hosts of some agents (``SCHEDULE_MAINTENANCE``, kept in
the registry by hostname, so a new leader keeps it). Until the window ends, every framework with
a live task on one of the host's agents holds an inverse offer for that agent; it answers
ACCEPT_INVERSE_OFFERS (it will vacate) or DECLINE_INVERSE_OFFERS, and the answer is shown to
operators. At the window's start the agents drain (their offers are rescinded, they get no new
ones) with the window's end as the drain's deadline. At a drain's deadline (that one, or the one
``DRAIN_AGENT`` was given) the master kills what still runs on the agent, reason AGENT_DRAINING.
A draining agent with no live task and no executor is DRAINED. ``CANCEL_MAINTENANCE`` removes the
windows, rescinds their inverse offers and reactivates the agents a started window drained.

Pure: time is an argument. Answers to inverse offers are soft state: after a failover the new
leader sends fresh inverse offers, and the frameworks answer again.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from typing import Protocol

from agora.master.core.actions import Peer
from agora.master.core.maintenance_state import (
    ACCEPTED,
    DECLINED,
    InverseOfferState,
)
from agora.master.core.offers import rescind_offers
from agora.master.core.state import Agent, AgentStatus, Framework, MasterState
from agora.master.core.tasks import stop
from agora.master.registry import DrainAgent as DrainOp
from agora.master.registry import MaintenanceWindow, SetMaintenance
from agora.sdk.ids import AgentID, FrameworkID
from agora.sdk.messages import (
    AcceptInverseOffers,
    CancelMaintenance,
    DeclineInverseOffers,
    ErrorCode,
    InverseOffer,
    InverseOfferAnswer,
    InverseOffers,
    MaintenanceSummary,
    Reason,
    RescindInverseOffer,
    ScheduleMaintenance,
    is_final,
)

__all__ = [
    "CHECK_INTERVAL",
    "drained",
    "on_answer",
    "on_cancel",
    "on_reactivated",
    "on_schedule",
    "set_offering",
    "summaries",
    "tick",
]

#: How often windows and drain deadlines are looked at (seconds).
CHECK_INTERVAL = 1.0


class Answer(Protocol):
    """How an operator call is answered (``operator_calls._Call``)."""

    def done(self, text: str) -> None: ...

    def refuse(self, code: ErrorCode, text: str) -> None: ...

    def lost(self) -> None: ...


# ---------------------------------------------------------------- operator calls


def on_schedule(st: MasterState, call: Answer, msg: ScheduleMaintenance, now: float) -> None:
    """Set the window of each named agent's host; answered once every window is committed."""
    hosts = _hosts_of(st, call, msg.agent_ids)
    if hosts is None:
        return
    if msg.duration <= 0:
        call.refuse(ErrorCode.BAD_REQUEST, f"the duration must be positive, got {msg.duration:g}")
        return
    if msg.start + msg.duration <= now:
        call.refuse(ErrorCode.BAD_REQUEST, "the window is already over (start + duration <= now)")
        return

    def op(hostname: str) -> SetMaintenance:
        window = MaintenanceWindow(hostname=hostname, start=msg.start, duration=msg.duration)
        return SetMaintenance(hostname=hostname, window=window)

    text = f"maintenance of {', '.join(hosts)} scheduled"
    _propose_all(st, call, [op(h) for h in hosts], text, now)


def on_cancel(st: MasterState, call: Answer, msg: CancelMaintenance, now: float) -> None:
    """Remove the windows of the named agents' hosts; reactivate what a started window drained."""
    hosts = _hosts_of(st, call, msg.agent_ids)
    if hosts is None:
        return
    windows = st.registry.maintenance
    planned = [h for h in hosts if h in windows]
    if not planned:
        call.done(f"no maintenance scheduled for {', '.join(hosts)}")
        return
    started = {h for h in planned if windows[h].start <= now}
    ops = [SetMaintenance(hostname=h) for h in planned]

    def after(now: float) -> None:
        _rescind_gone(st)
        for hostname in started:
            for agent_id, entry in st.registry.agents.items():
                if entry.hostname == hostname and entry.draining and agent_id not in st.busy_agents:
                    _propose_drain(st, agent_id, False, None, now)

    _propose_all(st, call, ops, f"maintenance of {', '.join(planned)} cancelled", now, after)


def on_reactivated(st: MasterState, agent_id: AgentID, now: float) -> None:
    """An operator reactivated the agent: a started window of its host is over (else a new
    leader would drain the agent again)."""
    entry = st.registry.agents.get(agent_id)
    window = st.registry.maintenance.get(entry.hostname) if entry is not None else None
    if window is not None and window.start <= now:
        op = SetMaintenance(hostname=window.hostname)
        st.propose(op, lambda _now: _rescind_gone(st), now=now)


def _hosts_of(st: MasterState, call: Answer, agent_ids: tuple[AgentID, ...]) -> list[str] | None:
    if not agent_ids:
        call.refuse(ErrorCode.BAD_REQUEST, "no agents named")
        return None
    hosts: list[str] = []
    for agent_id in agent_ids:
        entry = st.registry.agents.get(agent_id)
        if entry is None:
            call.refuse(ErrorCode.UNKNOWN_AGENT, f"no agent {agent_id} in the cluster")
            return None
        if entry.hostname not in hosts:
            hosts.append(entry.hostname)
    return hosts


def _propose_all(
    st: MasterState,
    call: Answer,
    ops: list[SetMaintenance],
    text: str,
    now: float,
    after: Callable[[float], None] | None = None,
) -> None:
    """Commit every operation; answer (and run ``after(now)``) once the last one is in."""
    left = [len(ops)]
    failed = [False]

    def committed(now: float) -> None:
        left[0] -= 1
        if left[0] == 0 and not failed[0]:
            if after is not None:
                after(now)
            refresh(st, now)
            call.done(text)

    def abandoned() -> None:
        if not failed[0]:
            failed[0] = True
            call.lost()

    for op in ops:
        st.propose(op, committed, abandoned, now=now)


# ---------------------------------------------------------------- the frameworks' answers


def on_answer(
    st: MasterState, fw: Framework, msg: AcceptInverseOffers | DeclineInverseOffers, now: float
) -> None:
    """Record the framework's answer; ids unknown (or of another framework) are ignored."""
    answer = ACCEPTED if isinstance(msg, AcceptInverseOffers) else DECLINED
    for inverse_offer_id in msg.inverse_offer_ids:
        io = st.maintenance.inverse_offers.get(inverse_offer_id)
        if io is None or io.framework_id != fw.framework_id:
            st.notice(
                "inverse_offer_unknown",
                framework_id=fw.framework_id,
                inverse_offer_id=inverse_offer_id,
            )
            continue
        io.answer = answer
        st.notice(
            "inverse_offer_answered",
            framework_id=fw.framework_id,
            agent_id=io.agent_id,
            hostname=io.hostname,
            answer=answer,
            at=now,
        )


# ---------------------------------------------------------------- timers


def tick(st: MasterState, now: float) -> None:
    """Once a second: inverse offers, window starts, drain deadlines."""
    if now < st.maintenance.next_check_at:
        return
    st.maintenance.next_check_at = now + CHECK_INTERVAL
    refresh(st, now)


def refresh(st: MasterState, now: float) -> None:
    """Bring inverse offers, drains and kills up to date with the registry and ``now``."""
    st.maintenance.checked_at = max(st.maintenance.checked_at, now)
    _rescind_gone(st)
    windows = st.registry.maintenance
    if windows:
        by_host: dict[str, list[Agent]] = defaultdict(list)
        for agent in st.agents.values():
            if agent.info.hostname in windows and agent.status is AgentStatus.ACTIVE:
                by_host[agent.info.hostname].append(agent)
        outgoing: dict[FrameworkID, list[InverseOffer]] = defaultdict(list)
        for hostname, window in windows.items():
            end = window.start + window.duration
            if now >= end:
                continue
            for agent in by_host.get(hostname, ()):
                _offer(st, agent, window, outgoing)
                if now >= window.start:
                    _start_drain(st, agent, window, now)
        for framework_id, batch in outgoing.items():
            st.send_framework(framework_id, InverseOffers(inverse_offers=tuple(batch)))
    _enforce_deadlines(st, now)


def _offer(
    st: MasterState,
    agent: Agent,
    window: MaintenanceWindow,
    outgoing: dict[FrameworkID, list[InverseOffer]],
) -> None:
    """An inverse offer to each framework with a live task on ``agent``; sent once per
    subscription of the framework."""
    ms = st.maintenance
    framework_ids = {
        task.framework_id
        for key in agent.tasks
        if (task := st.tasks.get(key)) is not None and not is_final(task.state)
    }
    for held in ms.inverse_offers.values():  # (also those whose framework's tasks ended since)
        if held.agent_id == agent.agent_id:
            framework_ids.add(held.framework_id)
    for framework_id in sorted(framework_ids):
        fw = st.frameworks.get(framework_id)
        if fw is None:
            continue
        io_id = ms.by_agent.get((agent.agent_id, framework_id))
        io = ms.inverse_offers.get(io_id) if io_id is not None else None
        if io is None:
            io = InverseOfferState(
                inverse_offer_id=st.mint("inverse"),
                framework_id=framework_id,
                agent_id=agent.agent_id,
                hostname=window.hostname,
                start=window.start,
                duration=window.duration,
            )
            ms.inverse_offers[io.inverse_offer_id] = io
            ms.by_agent[(agent.agent_id, framework_id)] = io.inverse_offer_id
        peer: Peer | None = fw.peer if fw.connected else None
        if peer is None:
            io.sent_to = None  # sent again once it subscribes anew
        elif io.sent_to != peer:
            io.sent_to = peer
            outgoing[framework_id].append(_wire(io))


def _wire(io: InverseOfferState) -> InverseOffer:
    return InverseOffer(
        inverse_offer_id=io.inverse_offer_id,
        framework_id=io.framework_id,
        agent_id=io.agent_id,
        hostname=io.hostname,
        start=io.start,
        duration=io.duration,
    )


def _rescind_gone(st: MasterState) -> None:
    """Rescind inverse offers whose window was cancelled or changed, or whose framework left."""
    ms = st.maintenance
    windows = st.registry.maintenance
    for io in list(ms.inverse_offers.values()):
        window = windows.get(io.hostname)
        fw = st.frameworks.get(io.framework_id)
        if (
            window is not None
            and (window.start, window.duration) == (io.start, io.duration)
            and fw is not None
        ):
            continue
        del ms.inverse_offers[io.inverse_offer_id]
        ms.by_agent.pop((io.agent_id, io.framework_id), None)
        if fw is not None:
            st.send_framework(
                io.framework_id, RescindInverseOffer(inverse_offer_id=io.inverse_offer_id)
            )


def _start_drain(st: MasterState, agent: Agent, window: MaintenanceWindow, now: float) -> None:
    """The window has started: drain the agent, deadline the window's end (once per window)."""
    key = (window.hostname, window.start, agent.agent_id)
    started = st.maintenance.started
    entry = st.registry.agents.get(agent.agent_id)
    if key in started or entry is None or agent.agent_id in st.busy_agents:
        return
    started.add(key)
    if entry.draining:
        return  # an operator drained it already: their deadline (if any) holds
    st.notice("maintenance_started", agent_id=agent.agent_id, hostname=window.hostname)
    _propose_drain(st, agent.agent_id, True, window.start + window.duration, now)


def _propose_drain(
    st: MasterState, agent_id: AgentID, draining: bool, deadline: float | None, now: float
) -> None:
    st.busy_agents.add(agent_id)

    def committed(now: float) -> None:
        st.busy_agents.discard(agent_id)
        set_offering(st, agent_id, offering=not draining, now=now)

    st.propose(
        DrainOp(agent_id=agent_id, draining=draining, deadline=deadline),
        committed,
        lambda: st.busy_agents.discard(agent_id),
        now=now,
    )


def _enforce_deadlines(st: MasterState, now: float) -> None:
    """Kill what still runs on agents whose drain deadline has passed (reason AGENT_DRAINING)."""
    for agent_id in sorted(st.registry.draining):
        deadline = st.registry.agents[agent_id].drain_deadline
        if deadline is None or now < deadline:
            continue
        agent = st.agents.get(agent_id)
        if agent is None or agent.status is not AgentStatus.ACTIVE:
            continue  # killed (again) when it comes back, at the next check
        for key in sorted(agent.tasks):
            task = st.tasks.get(key)
            if task is None or is_final(task.state) or task.stop_reason is Reason.AGENT_DRAINING:
                continue
            stop(st, task, Reason.AGENT_DRAINING, st.mint("drain-"), "the drain's deadline")


def set_offering(st: MasterState, agent_id: AgentID, *, offering: bool, now: float) -> None:
    """A drained agent's offers are rescinded and it gets no more; a reactivated one does."""
    agent = st.agents.get(agent_id)
    if agent is None or agent.status is not AgentStatus.ACTIVE:
        return  # it is made (in)active as the registry says when it comes back
    if not st.allocator.has_agent(agent_id):
        return
    if not offering:
        rescind_offers(st, [o.offer_id for o in st.offers.values() if o.agent_id == agent_id], now)
    st.allocator.set_agent_active(agent_id, offering)
    if offering:
        st.dirty_agents.add(agent_id)


# ---------------------------------------------------------------- what readers see


def drained(st: MasterState, agent: Agent) -> bool:
    """Draining, active, and nothing left on it: no live task, no executor."""
    entry = st.registry.agents.get(agent.agent_id)
    if entry is None or not entry.draining or agent.status is not AgentStatus.ACTIVE:
        return False
    if agent.executors:
        return False
    return all((task := st.tasks.get(key)) is None or is_final(task.state) for key in agent.tasks)


def summaries(st: MasterState, now: float) -> tuple[MaintenanceSummary, ...]:
    """Every window, by hostname, with its agents, status and the frameworks' answers."""
    windows = st.registry.maintenance
    if not windows:
        return ()
    agents: dict[str, list[AgentID]] = defaultdict(list)
    for agent_id, entry in st.registry.agents.items():
        if entry.hostname in windows:
            agents[entry.hostname].append(agent_id)
    answers: dict[str, list[InverseOfferAnswer]] = defaultdict(list)
    for io in st.maintenance.inverse_offers.values():
        answers[io.hostname].append(
            InverseOfferAnswer(
                inverse_offer_id=io.inverse_offer_id,
                framework_id=io.framework_id,
                agent_id=io.agent_id,
                answer=io.answer,
            )
        )
    out = []
    for hostname in sorted(windows):
        window = windows[hostname]
        ids = sorted(agents.get(hostname, ()))
        out.append(
            MaintenanceSummary(
                hostname=hostname,
                agent_ids=tuple(ids),
                start=window.start,
                duration=window.duration,
                status=_status(st, window, ids, now),
                answers=tuple(answers.get(hostname, ())),
            )
        )
    return tuple(out)


def _status(st: MasterState, window: MaintenanceWindow, ids: list[AgentID], now: float) -> str:
    if now < window.start:
        return "SCHEDULED"
    live = [a for i in ids if (a := st.agents.get(i)) is not None]
    if live and all(drained(st, a) for a in live):
        return "DRAINED"
    return "DRAINING"
