"""Safety properties checked after every stimulus, and liveness properties at the end of a run.

Online (after every delivered message and every tick), against the master's own state:

* every outstanding offer is on an active agent and in its framework's offer set; an offer id
  is offered once in the whole run; per agent, outstanding offers + resources of live tasks +
  executors fit in the agent's total (no resource is in two offers, or offered while used);
* the allocator agrees: per agent, what it has free plus what it counts as allocated is the
  total, and what it counts as allocated is exactly what the master has out (offers, live
  tasks, executors);
* what each agent really runs plus what is offered on it fits in the agent, except for
  ``overcommit_grace`` seconds (a kill in flight while its resources are offered again);
* one connection, one framework: a connected framework's peer is bound to that framework;
* every message carries the master's epoch; no task is sent to an agent twice
  (RUN_TASK / RUN_TASK_GROUP per (framework, task id) at most once);
* every KILL_TASK the master sends carries the id of a KILL its framework sent for that task
  (or none, when the master kills the tasks of a framework it removed).

At the end, after partitions heal and the cluster quiesces:

* every task a (surviving) framework launched has reached exactly one terminal state visible
  to it (FINISHED, FAILED, KILLED, ERROR, DROPPED, GONE; or LOST when not partition-aware),
  its last state is terminal, and no state the master made up contradicts an earlier
  terminal one (see ``task_history_problem``). LOST -> RUNNING is allowed for
  non-partition-aware frameworks and UNREACHABLE -> RUNNING for partition-aware ones;
* partition-aware frameworks never hear LOST; others never hear UNREACHABLE, GONE, DROPPED or
  UNKNOWN;
* where an agent ran the task, the framework's last word is the agent's;
* every kill is answered: a task a (surviving) framework killed ended for it afterwards
  (terminal, or LOST when not partition-aware), whatever the kill ids it took;
* nothing leaks: agents run nothing and hold no unacknowledged update; the master tracks no
  task; every active agent's resources are free or in outstanding offers.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable, Mapping

from agora.master.core import Master, Send
from agora.master.core.state import AgentStatus, MasterState
from agora.sdk.ids import AgentID, FrameworkID, OfferID
from agora.sdk.messages import (
    ErrorCode,
    KillTask,
    Offers,
    Reason,
    RunTask,
    RunTaskGroup,
    TaskState,
    is_terminal,
)
from agora.sdk.resources import Resources

from support.sim.batch import SimBatch
from support.sim.framework import FwTask, SimFramework, last_word, without_late_answers
from support.sim.host import SimHost

__all__ = ["Invariants", "Milli"]

Milli = dict[str, int]

_PA_ONLY = frozenset(
    {
        TaskState.UNREACHABLE,
        TaskState.GONE,
        TaskState.DROPPED,
        TaskState.UNKNOWN,
        TaskState.GONE_BY_OPERATOR,
    }
)


#: The reasons of reclaim's kills.
_RECLAIM = frozenset({Reason.TASK_PREEMPTED, Reason.RESOURCES_REVOKED})


#: Resources records are immutable: their totals, by the record's id (the record is kept, so
#: its id is not reused). The checks run after every message; summing afresh was most of a run.
_TOTALS: dict[int, tuple[Resources, tuple[tuple[str, int], ...]]] = {}


def _add(into: Milli, res: Resources) -> None:
    known = _TOTALS.get(id(res))
    if known is None or known[0] is not res:
        if len(_TOTALS) > 200_000:
            _TOTALS.clear()
        known = (res, tuple(res.scalar_totals_milli().items()))
        _TOTALS[id(res)] = known
    for name, amount in known[1]:
        into[name] = into.get(name, 0) + amount


def _fits(used: Mapping[str, int], total: Mapping[str, int]) -> bool:
    return all(amount <= total.get(name, 0) for name, amount in used.items())


def _same(a: Mapping[str, int], b: Mapping[str, int]) -> bool:
    names = set(a) | set(b)
    return all(a.get(n, 0) == b.get(n, 0) for n in names)


def _fmt(m: Mapping[str, int]) -> str:
    return ";".join(f"{n}:{v / 1000:g}" for n, v in sorted(m.items()) if v) or "(nothing)"


class Invariants:
    def __init__(
        self,
        master: Callable[[], Master | None],
        agents: Iterable[SimHost],
        frameworks: Iterable[SimFramework | SimBatch],
        *,
        check_executors: bool = True,
        overcommit_grace: float = 10.0,
    ) -> None:
        self._master = master
        self.agents = list(agents)
        self.frameworks = list(frameworks)
        self.check_executors = check_executors
        self.runs: Counter[tuple[FrameworkID, str]] = Counter()
        #: How long an agent may physically run more than the master believes is free.
        self.overcommit_grace = overcommit_grace
        self._overcommitted: dict[AgentID, float] = {}
        self._by_id: dict[AgentID, SimHost] = {}
        self.offered: set[OfferID] = set()
        self.checks = 0
        #: KILL_TASKs of reclaim sent.
        self.reclaims = 0

    @property
    def master(self) -> Master:
        master = self._master()
        assert master is not None, "no master acts at the end of the run"
        return master

    # --- online ------------------------------------------------------------------------
    def on_sends(self, sends: list[Send], core: Master) -> None:
        """``core`` sent ``sends`` (each must carry its epoch)."""
        epoch = core.epoch
        for send in sends:
            msg = send.message
            assert send.epoch == epoch, (
                f"{msg.NAME} to {send.to} carries epoch {send.epoch}, master is {epoch}"
            )
            if isinstance(msg, RunTask):
                self._ran(msg.framework_id, str(msg.task.task_id), send.to)
            elif isinstance(msg, RunTaskGroup):
                for task in msg.task_group.tasks:
                    self._ran(msg.framework_id, str(task.task_id), send.to)
            elif isinstance(msg, KillTask):
                self._kill_sent(msg, send.to, core)
            elif isinstance(msg, Offers):
                for offer in msg.offers:
                    assert offer.offer_id not in self.offered, (
                        f"offer id {offer.offer_id} offered twice "
                        f"(to {send.to}, agent {offer.agent_id})"
                    )
                    self.offered.add(offer.offer_id)

    def _kill_sent(self, msg: KillTask, to: str, core: Master) -> None:
        if msg.reason in _RECLAIM:
            self._reclaimed(msg, core)
            return
        fw = next((f for f in self.frameworks if f.framework_id == msg.framework_id), None)
        killed = fw.kills.get(msg.kill_id) if fw is not None and msg.kill_id else None
        if killed is None:  # the master's own kill, of the tasks of a framework it removed
            assert msg.kill_id, f"KILL_TASK for {msg.task_id} to {to} carries no kill id"
            assert msg.framework_id not in core.state.frameworks, (
                f"KILL_TASK for {msg.task_id} of live framework {msg.framework_id} to {to} "
                f"carries kill id {msg.kill_id!r}, which its framework never sent"
            )
            return
        assert killed == msg.task_id, (
            f"KILL_TASK for {msg.task_id} to {to} carries kill id {msg.kill_id!r}, "
            f"which its framework sent for {killed}"
        )

    def _reclaimed(self, msg: KillTask, core: Master) -> None:
        """A KILL of reclaim: never of a role left at or below its guarantee by what reclaim
        is taking from it, and never of a task on lent resources with TASK_PREEMPTED."""
        self.reclaims += 1
        st = core.state
        task = st.tasks.get((msg.framework_id, msg.task_id))
        assert task is not None, f"reclaim killed {msg.task_id}, which the master does not track"
        assert task.stop_reason is msg.reason
        assert (msg.reason is Reason.RESOURCES_REVOKED) == task.revocable, (
            f"reclaim killed {msg.task_id} (revocable: {task.revocable}) with {msg.reason}"
        )
        quota = st.config.quotas.get(task.role)
        if quota is None:
            return
        left = st.allocator.role_allocation(task.role)
        taking: Milli = {}
        for other in st.tasks.values():
            if other.role == task.role and other.stop_reason is not None and not other.released:
                _add(taking, other.resources)
        for name, floor in quota[0].scalar_totals_milli().items():
            assert left.get(name, 0) - taking.get(name, 0) >= floor, (
                f"reclaim killed {msg.task_id} of role {task.role}, taking it below its "
                f"guarantee of {quota[0]}: holds {_fmt(left)}, being taken {_fmt(taking)}"
            )

    def _ran(self, framework_id: FrameworkID, task_id: str, to: str) -> None:
        key = (framework_id, task_id)
        self.runs[key] += 1
        assert self.runs[key] == 1, (
            f"task {task_id} of {framework_id} launched {self.runs[key]} times (now to {to})"
        )

    def check(self, now: float) -> None:
        """The master's state is consistent with itself, with its allocator and with the agents."""
        self.checks += 1
        master = self._master()
        if master is None:
            return  # no leader acts: nothing to hold to account
        st = master.state
        alloc = st.allocator
        out: dict[AgentID, Milli] = {}
        for offer_id, offer in st.offers.items():
            agent = st.agents.get(offer.agent_id)
            assert agent is not None and agent.status is AgentStatus.ACTIVE, (
                f"offer {offer_id} is outstanding on agent {offer.agent_id}, which is not active"
            )
            fw = st.frameworks.get(offer.framework_id)
            assert fw is not None and offer_id in fw.offers, (
                f"offer {offer_id} is outstanding but not in the offers of "
                f"framework {offer.framework_id}"
            )
            assert offer_id in self.offered, f"offer {offer_id} is outstanding but was never sent"
            _add(out.setdefault(offer.agent_id, {}), offer.resources)
        allocated: dict[AgentID, Milli] = {}
        # Frameworks not subscribed yet with this master (after a failover) hold resources too:
        # the allocator counts what re-registering agents report they run for them.
        holders = set(st.frameworks) | {key[0] for key in st.tasks}
        for agent in st.agents.values():
            holders.update(fid for fid, _eid in agent.executors)
        for fw_id in sorted(holders):
            for (a, _role), res in alloc.allocated(fw_id).items():
                _add(allocated.setdefault(a, {}), res)
        for agent in st.agents.values():
            if agent.status is not AgentStatus.ACTIVE:
                continue
            aid = agent.agent_id
            assert st.agents_by_peer.get(agent.peer) == aid, (
                f"active agent {aid} is not bound to its peer {agent.peer}"
            )
            used = out.setdefault(aid, {})
            self._check_physical(aid, dict(used), now)
            for key in agent.tasks:
                task = st.tasks.get(key)
                assert task is not None, (
                    f"agent {aid} lists task {key}, which the master does not know"
                )
                if not task.released:
                    _add(used, task.resources)
            for info, _role in agent.executors.values():
                _add(used, info.resources)
            total = agent.info.resources.scalar_totals_milli()
            assert _fits(used, total), (
                f"agent {aid}: outstanding offers + live tasks + executors = {_fmt(used)} "
                f"exceed its total {_fmt(total)}"
            )
            free = alloc.available(aid).scalar_totals_milli()
            held = allocated.get(aid, {})
            assert _same(held, used), (
                f"agent {aid}: the allocator counts {_fmt(held)} allocated, the master has "
                f"{_fmt(used)} out in offers, live tasks and executors"
            )
            both = dict(free)
            for n, v in held.items():
                both[n] = both.get(n, 0) + v
            assert _same(both, total), (
                f"agent {aid}: available {_fmt(free)} + allocated {_fmt(held)} "
                f"!= total {_fmt(total)}"
            )
        _check_task_books(st)
        _check_agent_books(st)
        for fw in st.frameworks.values():
            if fw.connected:
                bound = st.frameworks_by_peer.get(fw.peer) if fw.peer is not None else None
                assert bound == fw.framework_id, (
                    f"framework {fw.framework_id} is connected on peer {fw.peer}, but that peer is "
                    f"bound to {bound}: two subscriptions share one connection"
                )

    def _check_physical(self, aid: AgentID, offered: Milli, now: float) -> None:
        """What the agent really runs plus what is offered on it fits in it, but for short
        windows (a kill in flight while its resources are re-offered)."""
        sim = self._by_id.get(aid)
        if sim is None:
            self._by_id = {a.agent_id: a for a in self.agents if a.agent_id is not None}
            sim = self._by_id.get(aid)
            if sim is None:
                return
        running = sim.running()
        physical = dict(offered)
        for _task_id, resources in running:
            _add(physical, resources)
        total = sim.total.scalar_totals_milli()
        if _fits(physical, total):
            self._overcommitted.pop(aid, None)
            return
        since = self._overcommitted.setdefault(aid, now)
        assert now - since <= self.overcommit_grace, (
            f"agent {aid} ({sim.name}) has run {sorted(t for t, _r in running)} while "
            f"{_fmt(offered)} of it was offered, {_fmt(physical)} in all, over its total "
            f"{_fmt(total)}, for {now - since:.1f} s: the master re-offered resources in use"
        )

    # --- end of run --------------------------------------------------------------------
    def final(self) -> None:
        problems: list[str] = []
        for fw in self.frameworks:
            problems.extend(self._framework_problems(fw))
            if isinstance(fw, SimBatch):
                problems.extend(fw.problems())
        truth = self._truth()
        for fw in self.frameworks:
            if fw.removed or fw.framework_id is None:
                continue
            for task in fw.tasks.values():
                agent_says = truth.get((fw.framework_id, str(task.task_id)))
                said = last_word(task)
                if agent_says is not None and said is not None and said != agent_says:
                    problems.append(
                        f"{fw.name} task {task.task_id}: framework's last word "
                        f"{said.name} "
                        f"but the agent ended it {agent_says.name} (heard {_history(task)})"
                    )
        for agent in self.agents:
            running = agent.running()
            if running:
                problems.append(f"agent {agent.name} still runs {[t for t, _r in running]}")
            if agent.unacknowledged():
                problems.append(
                    f"agent {agent.name} still holds unacknowledged updates {agent.pending()}"
                )
        st = self.master.state
        if st.tasks:
            left = {
                f"{k[0]}/{k[1]}": f"{t.state.name} on {t.agent_id}"
                + (" released" if t.released else "")
                for k, t in sorted(st.tasks.items())
            }
            problems.append(f"the master still tracks tasks after quiescence: {left}")
        for agent in st.agents.values():
            if agent.status is not AgentStatus.ACTIVE:
                problems.append(
                    f"agent {agent.agent_id} is still {agent.status.name} after partitions healed"
                )
                continue
            if self.check_executors and agent.executors:
                problems.append(
                    f"agent {agent.agent_id}: the master still tracks executors "
                    f"{sorted(agent.executors)}"
                )
            free = st.allocator.available(agent.agent_id).scalar_totals_milli()
            for offer in st.offers.values():
                if offer.agent_id == agent.agent_id:
                    _add(free, offer.resources)
            total = agent.info.resources.scalar_totals_milli()
            if not _same(free, total):
                problems.append(
                    f"agent {agent.agent_id}: free + offered = {_fmt(free)}, "
                    f"total {_fmt(total)}: resources leaked"
                )
        assert not problems, "end-of-run checks failed:\n  " + "\n  ".join(problems)

    def _truth(self) -> dict[tuple[FrameworkID, str], TaskState]:
        truth: dict[tuple[FrameworkID, str], TaskState] = {}
        for agent in self.agents:
            truth.update(agent.truth)
        return truth

    def _framework_problems(self, fw: SimFramework | SimBatch) -> list[str]:
        problems = []
        bad_errors = [e for e in fw.errors if e.code is ErrorCode.BAD_REQUEST]
        if bad_errors:
            problems.append(f"{fw.name} was refused valid calls: {[e.message for e in bad_errors]}")
        if fw.foreign_offers:
            ids = sorted({str(o.framework_id) for o in fw.foreign_offers})
            problems.append(
                f"{fw.name} (framework {fw.framework_id}) was sent "
                f"{len(fw.foreign_offers)} offers for "
                f"other framework ids {ids}"
            )
        if fw.unknown_updates:
            problems.append(
                f"{fw.name} got updates for tasks it never launched: "
                f"{[str(u.task_id) for u in fw.unknown_updates[:5]]}"
            )
        if fw.removed:
            return problems
        if not fw.subscribed:
            problems.append(f"{fw.name} is not subscribed at the end")
        pa = fw.spec.partition_aware
        for task in fw.tasks.values():
            problem = task_history_problem(task, pa)
            if problem is not None:
                problems.append(f"{fw.name} task {task.task_id} on {task.agent_id}: {problem}")
            problem = kill_problem(task, pa)
            if problem is not None:
                problems.append(f"{fw.name} task {task.task_id} on {task.agent_id}: {problem}")
        return problems


def _check_task_books(st: MasterState) -> None:
    """The running counts and the index of unclaimed tasks agree with the tasks themselves."""
    live = Counter(task.state for task in st.tasks.values())
    done = Counter(
        task.state
        for fw in (*st.frameworks.values(), *st.completed_frameworks)
        for task in fw.completed
    )
    kept_live, kept_done = _nonzero(st.tally.live), _nonzero(st.tally.done)
    assert kept_live == dict(live) and kept_done == dict(done), (
        f"task tally live {kept_live} done {kept_done}, recounted {dict(live)} and {dict(done)}"
    )
    for fw in st.frameworks.values():
        recount = Counter(st.tasks[key].state for key in fw.tasks if key in st.tasks)
        assert _nonzero(fw.live) == dict(recount), (
            f"{fw.framework_id}'s live tasks counted {_nonzero(fw.live)}, recounted {recount}"
        )
    known = [*st.tasks.values()] + [
        task for fw in (*st.frameworks.values(), *st.completed_frameworks) for task in fw.completed
    ]
    assert len(st.recency) == len(known) and all(task in st.recency for task in known), (
        f"the recency order holds {len(st.recency)} tasks, the master knows {len(known)}"
    )
    unclaimed = {key for key in st.tasks if key[0] not in st.frameworks}
    indexed = {key for keys in st.unclaimed_tasks.values() for key in keys}
    assert indexed == unclaimed and all(st.unclaimed_tasks.values()), (
        f"unclaimed tasks indexed {sorted(indexed)}, recounted {sorted(unclaimed)}"
    )


def _check_agent_books(st: MasterState) -> None:
    """The agents' counts and indexes agree with the agents themselves."""
    offline = {aid for aid, a in st.agents.items() if a.status is not AgentStatus.ACTIVE}
    assert st.offline_agents == offline, f"offline agents {st.offline_agents}, recounted {offline}"
    totals: Milli = {}
    for agent in st.agents.values():
        _add(totals, agent.info.resources)
    assert _same(st.agent_totals, totals), (
        f"agents' totals kept {_fmt(st.agent_totals)}, recounted {_fmt(totals)}"
    )
    draining = {aid for aid, e in st.registry.agents.items() if e.draining}
    assert st.registry.draining == draining, (
        f"registry's draining index {st.registry.draining}, recounted {draining}"
    )
    alloc = st.allocator
    ranked = list(alloc.busiest())
    active = set(st.agents) - offline
    assert set(ranked) == active and len(ranked) == len(active), (
        f"the allocator ranks {sorted(ranked)}, the active agents are {sorted(active)}"
    )
    percents = [alloc.busy_percent(aid) for aid in ranked]
    assert percents == sorted(percents, reverse=True), f"busiest order {percents} is not sorted"
    for aid in ranked:
        total, free = alloc.scalars(aid)
        held = [-(-(v - free.get(n, 0)) * 100 // v) for n, v in total.items() if v > 0]
        assert alloc.busy_percent(aid) == max([0, *held]), (
            f"agent {aid} ranked {alloc.busy_percent(aid)}% busy, recounted {max([0, *held])}%"
        )


def _nonzero(counts: Counter[TaskState]) -> dict[TaskState, int]:
    return {state: n for state, n in counts.items() if n}  # (a negative count stays visible)


def kill_problem(task: FwTask, partition_aware: bool) -> str | None:
    """Why the kills of ``task`` were not answered (None if it was not killed, or was)."""
    if not task.kill_ids:
        return None
    after = task.states[task.states_before_kill :]
    last = after[-1] if after else None
    if last is not None and (is_terminal(last) or (last is TaskState.LOST and not partition_aware)):
        return None
    return f"kills {task.kill_ids} never answered (heard {_history(task)})"


_NEVER_RAN = frozenset({TaskState.GONE, TaskState.DROPPED})


def task_history_problem(task: FwTask, partition_aware: bool) -> str | None:
    """What is wrong with the states a framework heard for one task, if anything.

    * partition-aware frameworks never hear LOST, others never UNREACHABLE, GONE, DROPPED...;
    * exactly one terminal state: every terminal state heard is the same one (but GONE and
      DROPPED, which both say the task does not run, may both be heard; and a reconciliation
      answer about the task once the master forgot it, after the stream ended it, is left out);
    * the last state heard is terminal (LOST counts for a framework that is not
      partition-aware);
    * the agent's stream is in order, and the master says a task is over only when it is:
      after a terminal state, no stream update is non-terminal;
    * reconciliation answers with the state of the newest update the master forwarded (as
      Mesos does), so it never runs ahead of the stream: after a terminal state heard from
      reconciliation nothing non-terminal follows;
    * the master does not contradict itself: after any terminal state, nothing it makes up
      is non-terminal; when an agent re-registers, the master announces a task's state only
      if the agent has no update pending for it, so that announcement never runs ahead of the
      stream either.
    """
    heard = _history(task)
    states, kinds = without_late_answers(task)
    if not states:
        return "the framework never heard of it after launching it"
    if partition_aware:
        wrong = [s for s in states if s is TaskState.LOST]
    else:
        wrong = [s for s in states if s in _PA_ONLY]
    if wrong:
        kind = "partition-aware" if partition_aware else "not partition-aware"
        return f"a {kind} framework heard {wrong[0].name} (heard {heard})"
    terminal = {s for s in states if is_terminal(s)}
    if terminal == _NEVER_RAN:
        # Both say the task does not run: the master answers GONE for a task it does not know on
        # a registered agent (after a failover), the agent DROPPED for one it never got. Which
        # comes first is a race, as in Mesos.
        terminal = {TaskState.DROPPED}
    if len(terminal) > 1:
        return f"heard {len(terminal)} different terminal states (heard {heard})"
    terminal_from: set[str] = set()
    for state, kind in zip(states, kinds, strict=True):
        if is_terminal(state):
            terminal_from.add(kind)
            continue
        if not terminal_from:
            continue
        if kind == "stream":
            return (
                f"the agent's stream delivered {state.name} after the terminal state "
                f"(heard {heard})"
            )
        return f"the master reported {state.name} after a terminal state (heard {heard})"
    last = states[-1]
    if not (is_terminal(last) or (last is TaskState.LOST and not partition_aware)):
        return f"last state {last.name} is not terminal (heard {heard})"
    return None


def _history(task: FwTask) -> str:
    return " ".join(f"{s.name}({k})" for s, k in zip(task.states, task.kinds, strict=True))
