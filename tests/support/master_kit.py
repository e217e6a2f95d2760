"""Drive a real ``Master`` core by hand: a fake clock, peers by name, and the sent messages.

Every message into and out of the core goes through the real codec, so a test
also proves that what the core produced can travel on the wire.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agora.master.core import Master, MasterConfig, Send
from agora.sdk import codec
from agora.sdk.ids import AgentID, FrameworkID, TaskID
from agora.sdk.messages import (
    Accept,
    Acknowledge,
    AgentInfo,
    CommandInfo,
    Filters,
    FrameworkCapability,
    FrameworkInfo,
    Launch,
    Message,
    Offer,
    Offers,
    RegisterAgent,
    StatusSource,
    StatusUpdate,
    StatusUpdateMessage,
    Subscribe,
    Subscribed,
    TaskInfo,
    TaskState,
    TaskStatus,
    Update,
)
from agora.sdk.resources import Resources

M = TypeVar("M")


@dataclass
class Harness:
    config: MasterConfig = field(default_factory=MasterConfig)
    now: float = 0.0

    def __post_init__(self) -> None:
        self.master = Master(self.config)
        self.sent: list[Send] = []
        self._uuid = 0

    # --- stimuli ------------------------------------------------------------------------
    def handle(self, peer: str, message: Message) -> list[Send]:
        wire = codec.decode(codec.encode(message)).message
        return self._record(self.master.handle(peer, wire, self.now))

    def tick(self, advance: float = 0.0) -> list[Send]:
        self.now += advance
        return self._record(self.master.tick(self.now))

    def disconnect(self, peer: str) -> list[Send]:
        return self._record(self.master.disconnected(peer, self.now))

    def _record(self, actions: list[Send]) -> list[Send]:
        for action in actions:
            assert action.epoch == self.master.epoch, "every message carries the master's epoch"
            envelope = codec.decode(codec.encode(action.message, epoch=action.epoch))
            assert envelope.message == action.message
        self.sent.extend(actions)
        return actions

    def unclaimed(self, agent_id: AgentID) -> Resources:
        """What on the agent is not used by tasks: free now, or in an outstanding offer."""
        st = self.master.state
        total = st.allocator.available(agent_id)
        for offer in st.offers.values():
            if offer.agent_id == agent_id:
                total = total + offer.resources
        return total

    # --- common moves -------------------------------------------------------------------
    def register_agent(
        self, peer: str, resources: str = "cpus:4;mem:4096", **attrs: str
    ) -> AgentID:
        info = AgentInfo(hostname=peer, resources=Resources.parse(resources), attributes=attrs)
        out = self.handle(peer, RegisterAgent(agent_info=info))
        registered = only(sent_to(out, peer))
        return AgentID(registered.agent_id)

    def subscribe(
        self,
        peer: str,
        roles: tuple[str, ...] = ("*",),
        *,
        partition_aware: bool = False,
        failover_timeout: float = 0.0,
        framework_id: FrameworkID | None = None,
        suppressed_roles: tuple[str, ...] = (),
        revocable: bool = False,
    ) -> FrameworkID:
        caps = (FrameworkCapability.PARTITION_AWARE,) if partition_aware else ()
        if revocable:
            caps += (FrameworkCapability.REVOCABLE_RESOURCES,)
        info = FrameworkInfo(
            name=peer,
            roles=roles,
            capabilities=caps,
            failover_timeout=failover_timeout,
            framework_id=framework_id,
        )
        out = self.handle(peer, Subscribe(framework_info=info, suppressed_roles=suppressed_roles))
        subscribed = only(of_type(sent_to(out, peer), Subscribed))
        return subscribed.framework_id

    def launch(
        self,
        peer: str,
        framework_id: FrameworkID,
        offers: Iterable[Offer],
        tasks: Iterable[tuple[str, str, AgentID]],
        refuse_seconds: float = 5.0,
    ) -> list[Send]:
        """ACCEPT ``offers`` launching (task_id, resources, agent_id) command tasks."""
        infos = tuple(task_info(tid, res, aid) for tid, res, aid in tasks)
        return self.handle(
            peer,
            Accept(
                framework_id=framework_id,
                offer_ids=tuple(o.offer_id for o in offers),
                operations=(Launch(task_infos=infos),) if infos else (),
                filters=Filters(refuse_seconds=refuse_seconds),
            ),
        )

    def agent_update(
        self,
        agent_peer: str,
        framework_id: FrameworkID,
        task_id: str,
        state: TaskState,
        *,
        latest: TaskState | None = None,
    ) -> tuple[list[Send], bytes]:
        self._uuid += 1
        uuid = self._uuid.to_bytes(16, "big")
        status = TaskStatus(
            task_id=TaskID(task_id), state=state, source=StatusSource.EXECUTOR, uuid=uuid
        )
        msg = StatusUpdateMessage(
            update=StatusUpdate(framework_id=framework_id, status=status, latest_state=latest)
        )
        return self.handle(agent_peer, msg), uuid

    def ack(
        self, peer: str, framework_id: FrameworkID, agent_id: AgentID, task_id: str, uuid: bytes
    ) -> list[Send]:
        return self.handle(
            peer,
            Acknowledge(
                framework_id=framework_id, agent_id=agent_id, task_id=TaskID(task_id), uuid=uuid
            ),
        )


def task_info(task_id: str, resources: str, agent_id: AgentID) -> TaskInfo:
    return TaskInfo(
        task_id=TaskID(task_id),
        name=task_id,
        agent_id=agent_id,
        resources=Resources.parse(resources),
        command=CommandInfo(value="true"),
    )


def sent_to(actions: Iterable[Send], peer: str) -> list[Any]:
    return [a.message for a in actions if a.to == peer]


def of_type(messages: Iterable[Any], kind: type[M]) -> list[M]:
    return [m for m in messages if isinstance(m, kind)]


def only(items: list[M]) -> M:
    assert len(items) == 1, f"expected exactly one, got {items!r}"
    return items[0]


def offers_in(actions: Iterable[Send], peer: str) -> list[Offer]:
    return [o for m in of_type(sent_to(actions, peer), Offers) for o in m.offers]


def updates_in(actions: Iterable[Send], peer: str) -> list[TaskStatus]:
    return [m.status for m in of_type(sent_to(actions, peer), Update)]
