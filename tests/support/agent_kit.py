"""Drive a real agent core by hand: a fake clock, executors by peer name, the actions it returns.

Every message into and out of the core goes through the real codec, so the core only ever
sees wire-valid messages and a test also proves that what it produced can travel.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from agora.agent.core import Action, Agent, AgentConfig, ToExecutor, ToMaster
from agora.sdk import codec
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, TaskID
from agora.sdk.messages import (
    AgentRegistered,
    CommandInfo,
    ExecutorInfo,
    FrameworkInfo,
    MasterInfo,
    Message,
    RegisterExecutor,
    RunTask,
    RunTaskGroup,
    StatusSource,
    StatusUpdate,
    StatusUpdateAck,
    StatusUpdateMessage,
    TaskGroupInfo,
    TaskInfo,
    TaskState,
    TaskStatus,
)
from agora.sdk.resources import Resources

M = TypeVar("M")

AGENT_ID = AgentID("e1-A1")
FID = FrameworkID("fw-1")
MASTER_INFO = MasterInfo(master_id="master", address="tcp://127.0.0.1:5050", epoch=1)


def config(**overrides: Any) -> AgentConfig:
    base: dict[str, Any] = {
        "hostname": "host-1",
        "resources": Resources.parse("cpus:4;mem:4096"),
        "attributes": {"rack": "a"},
        "port": 5051,
    }
    base.update(overrides)
    return AgentConfig(**base)


def wire(message: Message, epoch: int = 0) -> Message:
    envelope = codec.decode(codec.encode(message, epoch=epoch))
    assert envelope.message == message
    return envelope.message


@dataclass
class AgentHarness:
    cfg: AgentConfig = field(default_factory=config)
    now: float = 1000.0
    epoch: int = 1

    def __post_init__(self) -> None:
        self.agent = Agent(self.cfg)
        self.actions: list[Action] = []
        self._uuid = 0

    @property
    def st(self) -> Any:
        return self.agent.state

    # --- stimuli ---------------------------------------------------------------------------
    def master(self, message: Message, epoch: int | None = None) -> list[Action]:
        e = self.epoch if epoch is None else epoch
        return self._record(self.agent.from_master(wire(message, e), e, self.now))

    def executor(self, peer: str, message: Message) -> list[Action]:
        return self._record(self.agent.from_executor(peer, wire(message), self.now))

    def tick(self, advance: float = 0.0) -> list[Action]:
        self.now += advance
        return self._record(self.agent.tick(self.now))

    def connected(self) -> list[Action]:
        return self._record(self.agent.connected(self.now))

    def disconnected(self) -> list[Action]:
        return self._record(self.agent.disconnected(self.now))

    def exited(self, framework_id: str, executor_id: str, status: int) -> list[Action]:
        return self._record(
            self.agent.executor_exited(
                FrameworkID(framework_id), ExecutorID(executor_id), status, self.now
            )
        )

    def launch_failed(self, framework_id: str, executor_id: str, error: str) -> list[Action]:
        return self._record(
            self.agent.executor_launch_failed(
                FrameworkID(framework_id), ExecutorID(executor_id), error, self.now
            )
        )

    def _record(self, actions: list[Action]) -> list[Action]:
        for action in actions:
            if isinstance(action, ToMaster | ToExecutor):
                wire(action.message)
        self.actions.extend(actions)
        return actions

    # --- common moves ----------------------------------------------------------------------
    def register(self, agent_id: AgentID = AGENT_ID) -> list[Action]:
        self.connected()
        return self.master(AgentRegistered(agent_id=agent_id, master_info=MASTER_INFO))

    def run(
        self,
        task_id: str,
        *,
        framework_id: FrameworkID = FID,
        executor: ExecutorInfo | None = None,
        role: str = "*",
        resources: str = "cpus:1;mem:128",
    ) -> list[Action]:
        task = task_info(task_id, executor=executor, resources=resources)
        return self.master(
            RunTask(
                framework_info=FrameworkInfo(name="fw", user="alice"),
                framework_id=framework_id,
                task=task,
                role=role,
            )
        )

    def run_group(
        self, task_ids: Iterable[str], executor: ExecutorInfo, *, framework_id: FrameworkID = FID
    ) -> list[Action]:
        tasks = tuple(task_info(t, executor=None, command=True) for t in task_ids)
        return self.master(
            RunTaskGroup(
                framework_info=FrameworkInfo(name="fw"),
                framework_id=framework_id,
                executor=executor,
                task_group=TaskGroupInfo(tasks=tasks),
            )
        )

    def start_executor(
        self, peer: str, executor_id: str = "agora-command", framework_id: FrameworkID = FID
    ) -> list[Action]:
        eid = ExecutorID(executor_id)
        secret = self.secret(executor_id, framework_id)
        return self.executor(
            peer, RegisterExecutor(framework_id=framework_id, executor_id=eid, secret=secret)
        )

    def secret(self, executor_id: str, framework_id: FrameworkID = FID) -> str:
        """The secret the agent launched this executor with ("" if it does not know it)."""
        ex = self.agent.state.executors.get((framework_id, ExecutorID(executor_id)))
        return ex.secret if ex is not None else ""

    def next_uuid(self) -> bytes:
        self._uuid += 1
        return self._uuid.to_bytes(16, "big")

    def update(
        self,
        peer: str,
        task_id: str,
        state: TaskState,
        *,
        framework_id: FrameworkID = FID,
        uuid: bytes | None = None,
        exit_code: int | None = None,
    ) -> tuple[list[Action], bytes]:
        """An executor's status update (with a fresh uuid unless one is given)."""
        uuid = uuid if uuid is not None else self.next_uuid()
        status = TaskStatus(
            task_id=TaskID(task_id),
            state=state,
            source=StatusSource.EXECUTOR,
            uuid=uuid,
            timestamp=self.now,
            exit_code=exit_code,
        )
        msg = StatusUpdateMessage(update=StatusUpdate(framework_id=framework_id, status=status))
        return self.executor(peer, msg), uuid

    def ack(self, task_id: str, uuid: bytes, *, framework_id: FrameworkID = FID) -> list[Action]:
        return self.master(
            StatusUpdateAck(
                framework_id=framework_id, task_id=TaskID(task_id), uuid=uuid, agent_id=AGENT_ID
            )
        )


def executor_info(
    executor_id: str = "exec-1", framework_id: FrameworkID = FID, **env: str
) -> ExecutorInfo:
    return ExecutorInfo(
        executor_id=ExecutorID(executor_id),
        framework_id=framework_id,
        command=CommandInfo(value="./my-executor", environment=env),
        resources=Resources.parse("cpus:0.1;mem:32"),
        name="custom",
    )


def task_info(
    task_id: str,
    *,
    executor: ExecutorInfo | None = None,
    command: bool | None = None,
    resources: str = "cpus:1;mem:128",
    agent_id: AgentID = AGENT_ID,
) -> TaskInfo:
    with_command = executor is None if command is None else command
    return TaskInfo(
        task_id=TaskID(task_id),
        name=task_id,
        agent_id=agent_id,
        resources=Resources.parse(resources),
        command=CommandInfo(value="sleep 1") if with_command else None,
        executor=executor,
    )


# --- reading actions -------------------------------------------------------------------------


def to_master(actions: Iterable[Action]) -> list[Message]:
    return [a.message for a in actions if isinstance(a, ToMaster)]


def to_executor(actions: Iterable[Action], peer: str) -> list[Message]:
    return [a.message for a in actions if isinstance(a, ToExecutor) and a.peer == peer]


def of_type(items: Iterable[Any], kind: type[M]) -> list[M]:
    return [m for m in items if isinstance(m, kind)]


def only(items: list[M]) -> M:
    assert len(items) == 1, f"expected exactly one, got {items!r}"
    return items[0]


def forwarded(actions: Iterable[Action]) -> list[StatusUpdate]:
    """The status updates the agent forwarded to the master."""
    return [m.update for m in of_type(to_master(actions), StatusUpdateMessage)]


def snapshot(agent: Agent) -> tuple[str, ...]:
    """Everything a stimulus could change, as text, for 'changes nothing' checks."""
    st = agent.state
    updates = st.updates
    return (
        repr(st.agent_id),
        repr(st.registered),
        repr(st.frameworks),
        repr(st.executors),
        repr(st.executors_by_peer),
        repr(st.tasks),
        repr(sorted((k, updates.pending(*k)) for k in updates)),
    )
