"""Reclaim in the master: carry out what the allocator decides a role below its guarantee is owed.

Every ``reclaim_interval`` the allocator names the claimant roles and what they need
(:meth:`~agora.master.allocator.Allocator.claims`). Only then are the candidates gathered —
other roles' outstanding offers and running tasks on active agents — and the allocator plans
what to take (:mod:`agora.master.allocator.reclaim`). Offers are rescinded; tasks are killed
through their agents with the kill grace period, and end KILLED with reason TASK_PREEMPTED,
or RESOURCES_REVOKED for tasks on revocable resources. Their resources come back when their
agent reports the end, and the allocator's first stage offers them to the roles below their
guarantee before anyone else.

A task's priority, for choosing among victims of one role, is its ``agora.priority`` label
(an integer; 0 when absent or not a number): lower goes first.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping

from agora.master.allocator.reclaim import Candidate, Claim, ReclaimConfig, Victim
from agora.master.core.offers import rescind_offers
from agora.master.core.state import AgentStatus, MasterState, Task, TaskKey
from agora.master.core.tasks import stop
from agora.sdk.ids import OfferID
from agora.sdk.messages import Reason, TaskState, is_final

__all__ = ["PRIORITY_LABEL", "reclaim"]

PRIORITY_LABEL = "agora.priority"

#: The reasons of reclaim's kills (a drain's kill has its own).
_RECLAIM = frozenset({Reason.TASK_PREEMPTED, Reason.RESOURCES_REVOKED})

#: States in which a task holds resources and can be stopped.
_RUNNING = frozenset({TaskState.STAGING, TaskState.STARTING, TaskState.RUNNING, TaskState.KILLING})


def reclaim(st: MasterState, now: float) -> None:
    """One reclaim round, if one is due and a role claims what it is owed."""
    cfg = st.config.reclaim
    if not cfg.enabled or now < st.next_reclaim_at:
        return
    st.next_reclaim_at = now + cfg.interval
    claims = st.allocator.claims(now)
    if not claims:
        return
    # Offers, lent tasks and those being stopped first: usually enough, and far fewer than
    # every task of a big cluster. Every task only when they fall short.
    wanted = {name for claim in claims for name in claim.need}
    candidates, tasks = _candidates(st, wanted, st.revocable_tasks | st.reclaiming)
    victims = st.allocator.plan_reclaim(claims, candidates, now, cfg)
    if _short(claims, candidates, victims, cfg):
        candidates, tasks = _candidates(st, wanted, None)
        victims = st.allocator.plan_reclaim(claims, candidates, now, cfg)
    rescind: list[OfferID] = []
    for victim in victims:
        key = victim.candidate.key
        if key in tasks:
            _take(st, tasks[key], victim)
        else:
            rescind.append(OfferID(str(key)))
    if rescind:
        st.notice("reclaim_rescinds", offers=",".join(sorted(rescind)))
        rescind_offers(st, rescind, now)


def _short(
    claims: list[Claim], candidates: list[Candidate], victims: list[Victim], cfg: ReclaimConfig
) -> bool:
    """Whether the claims are not covered by what is being stopped and what the round takes,
    though the round could take more tasks."""
    if sum(v.candidate.kind == "task" for v in victims) >= cfg.max_victims:
        return False
    coming: dict[str, int] = {}
    for scalars in [c.scalars for c in candidates if c.stopping] + [
        v.candidate.scalars for v in victims
    ]:
        for name, value in scalars.items():
            coming[name] = coming.get(name, 0) + value
    need: dict[str, int] = {}
    for claim in claims:
        for name, value in claim.need.items():
            need[name] = need.get(name, 0) + value
    return any(coming.get(name, 0) < value for name, value in need.items())


def _candidates(
    st: MasterState, wanted: set[str], only: set[TaskKey] | None
) -> tuple[list[Candidate], dict[Hashable, Task]]:
    """What reclaim may take (outstanding offers, and the tasks of ``only``, or all) that holds
    some of the ``wanted`` scalars, and the tasks among them by candidate key."""
    # Agents being drained are left out: nothing freed there would be offered.
    active = {
        aid
        for aid, a in st.agents.items()
        if a.status is AgentStatus.ACTIVE
        and not ((entry := st.registry.agents.get(aid)) is not None and entry.draining)
    }
    out = [
        Candidate(
            key=str(o.offer_id),
            kind="offer",
            role=o.role,
            scalars=o.milli,
            revocable=o.revocable,
        )
        for o in st.offers.values()
        if o.gang_id is None and o.agent_id in active and _holds(o.milli, wanted)
    ]
    tasks: dict[Hashable, Task] = {}
    pairs = (
        st.tasks.items()
        if only is None
        else ((key, task) for key in only if (task := st.tasks.get(key)) is not None)
    )
    for key, task in pairs:
        if (
            task.released
            or task.state not in _RUNNING
            or task.agent_id not in active
            or not _holds(task.milli, wanted)
        ):
            continue
        tasks[key] = task
        out.append(
            Candidate(
                key=key,
                kind="task",
                role=task.role,
                scalars=task.milli,
                revocable=task.revocable,
                priority=_priority(task),
                started_at=task.launched_at,
                stopping=task.stop_reason in _RECLAIM,
            )
        )
    return out, tasks


def _holds(milli: Mapping[str, int], wanted: set[str]) -> bool:
    # A loop, not any(): this runs for every offer and task of a reclaim round.
    for name in wanted:  # noqa: SIM110
        if milli.get(name, 0) > 0:
            return True
    return False


def _priority(task: Task) -> int:
    text = task.info.labels.get(PRIORITY_LABEL)
    if text is None:
        return 0
    try:
        return int(text)
    except ValueError:
        return 0


def _take(st: MasterState, task: Task, victim: Victim) -> None:
    if is_final(task.state):
        return
    reason = Reason.RESOURCES_REVOKED if victim.revoked else Reason.TASK_PREEMPTED
    st.reclaiming.add(task.key)
    why = f"reclaim from role {task.role} for role {victim.claimant}"
    stop(st, task, reason, st.mint("reclaim-"), why)
