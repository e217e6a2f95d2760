"""Registration with the master: (re-)register with backoff, answer pings, notice a lost master.

The agent registers (REGISTER_AGENT) until it has an id, and re-registers (REREGISTER_AGENT,
reporting its tasks, executors and frameworks; both report the dynamic reservations it
checkpointed, see reservations.py) whenever it may have been lost: the link came
back up, the master's pings stopped for ``master_timeout``, a ping said the master does not
know us (``connected=False``), or a master of a newer epoch spoke. Unanswered attempts are
retried with a doubling, capped backoff. Status updates are held while unregistered and every
stream's head is re-sent once the master answers. A master with more registrations waiting than
it answers promptly says when to try again (RETRY_REGISTRATION); that replaces the backoff.
"""

from __future__ import annotations

import hashlib

from agora.agent.core.state import AgentState
from agora.sdk.messages import (
    AgentRegistered,
    AgentReregistered,
    AgentTask,
    FrameworkInfo,
    Ping,
    Pong,
    RegisterAgent,
    ReregisterAgent,
    RetryRegistration,
)
from agora.sdk.messages.batching import FEATURES

__all__ = [
    "lost_master",
    "on_ping",
    "on_registered",
    "on_reregistered",
    "on_retry",
    "reregister_message",
    "start_registration",
    "tick_registration",
]


def start_registration(st: AgentState, now: float) -> None:
    """Become unregistered and send a (re-)registration now, backoff reset."""
    st.registered = False
    st.updates.pause()
    st.registration_backoff = st.config.registration_backoff
    st.registration_attempts = 0
    _attempt(st, now)


def lost_master(st: AgentState, now: float) -> None:
    """The master link went down: unregistered until the master answers again. Attempts keep
    going out on their backoff schedule (the shell queues them until the link is back, and
    ``connected`` sends one at once when it is)."""
    if st.registered:
        st.registered = False
        st.updates.pause()
        st.registration_backoff = st.config.registration_backoff
        st.registration_attempts = 0
        st.next_registration_at = now + _spread(st.registration_backoff, st.config.hostname)


def tick_registration(st: AgentState, now: float) -> None:
    if st.registered:
        if now - st.last_ping_at >= st.config.master_timeout:
            start_registration(st, now)
        return
    if st.next_registration_at is not None and now >= st.next_registration_at:
        _attempt(st, now)


def _attempt(st: AgentState, now: float) -> None:
    if st.agent_id is None:
        st.to_master(
            RegisterAgent(
                agent_info=st.agent_info,
                features=FEATURES,
                checkpointed_resources=st.checkpointed_resources,
                checkpointed_volumes=st.checkpointed_volumes,
            )
        )
    else:
        st.to_master(reregister_message(st))
    delay = _spread(st.registration_backoff, f"{st.config.hostname}/{st.registration_attempts}")
    st.next_registration_at = now + delay
    st.registration_attempts += 1
    st.registration_backoff = min(st.registration_backoff * 2, st.config.registration_backoff_max)


def on_retry(st: AgentState, msg: RetryRegistration, now: float) -> None:
    """The master put our (re-)registration off: send it again after ``retry_after`` (the
    master gave each agent it put off a time of its own), up to a tenth later by a hash of the
    hostname, and start the backoff over."""
    if st.registered:
        return
    jitter = 0.1 * _fraction(f"{st.config.hostname}/retry/{st.registration_attempts}")
    st.next_registration_at = now + msg.retry_after * (1.0 + jitter)
    st.registration_backoff = st.config.registration_backoff


def _spread(delay: float, salt: str) -> float:
    """``delay`` scaled into [delay/2, delay] by a hash of ``salt``: deterministic jitter."""
    return delay * (0.5 + 0.5 * _fraction(salt))


def _fraction(salt: str) -> float:
    """A number in [0, 1) from a hash of ``salt``."""
    digest = hashlib.sha256(salt.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def reregister_message(st: AgentState) -> ReregisterAgent:
    """What the agent reports when it re-registers: every task it still holds (live, or final
    with an unacknowledged update) with the uuid of its stream's head, every custom executor,
    and the frameworks they belong to."""
    assert st.agent_id is not None
    tasks = []
    for (framework_id, task_id), task in st.tasks.items():
        head = st.updates.head(framework_id, task_id)
        tasks.append(
            AgentTask(
                task=task.info,
                framework_id=framework_id,
                state=task.state,
                status_uuid=head.uuid if head is not None else None,
                role=task.role,
                status_state=head.state if head is not None else None,
            )
        )
    executors = tuple(ex.info for ex in st.executors.values() if not ex.builtin)
    frameworks: tuple[FrameworkInfo, ...] = tuple(fw.info for fw in st.frameworks.values())
    return ReregisterAgent(
        agent_id=st.agent_id,
        agent_info=st.agent_info,
        tasks=tuple(tasks),
        executors=executors,
        frameworks=frameworks,
        features=FEATURES,
        checkpointed_resources=st.checkpointed_resources,
        checkpointed_volumes=st.checkpointed_volumes,
    )


def on_registered(st: AgentState, msg: AgentRegistered, epoch: int, now: float) -> None:
    if st.agent_id is not None and msg.agent_id != st.agent_id:
        return  # not our id: a confused or stale answer
    if st.agent_id is None:
        st.dirty_agent = True
    st.agent_id = msg.agent_id
    _accepted(st, msg.master_info.epoch if epoch == 0 else epoch, now, msg)


def on_reregistered(st: AgentState, msg: AgentReregistered, epoch: int, now: float) -> None:
    if st.agent_id is None or msg.agent_id != st.agent_id:
        return
    _accepted(st, msg.master_info.epoch if epoch == 0 else epoch, now, msg)


def _accepted(
    st: AgentState, epoch: int, now: float, msg: AgentRegistered | AgentReregistered
) -> None:
    st.master_info = msg.master_info
    st.registered_epoch = epoch
    st.last_ping_at = now
    if st.registered:
        return  # the answer to a retried attempt: nothing new
    st.registered = True
    st.next_registration_at = None
    st.updates.resume(now)
    st.flush_updates()


def on_ping(st: AgentState, msg: Ping, now: float) -> None:
    st.last_ping_at = now
    st.to_master(Pong())
    if not msg.connected and st.registered:
        # The master does not know us (any more): register again.
        start_registration(st, now)
