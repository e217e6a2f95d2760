"""What the agent checkpoints: durable records, the changes since the last checkpoint, decoding.

Six kinds of record, each a msgpack map (``agora.sdk.codec.pack_record``) under a string key:

=========  ======================  ==========================================================
kind       key                     value
=========  ======================  ==========================================================
agent      ``"id"``                :class:`AgentRecord`: the agent id
framework  framework id            :class:`FrameworkRecord`: FrameworkInfo, terminating
executor   ``fid`` + ``eid``       :class:`ExecutorRecord`: info, builtin, state, shutdown
                                   requested, queued and successor launches, recovery kill,
                                   the executor's secret
task       ``fid`` + ``tid``       :class:`TaskRecord`: TaskInfo, executor id, role, state,
                                   launched, the GPUs it holds
stream     ``fid`` + ``tid``       :class:`StreamRecord`: pending updates in order, seen uuids
resources  ``"checkpointed"``      :class:`ResourcesRecord`: the dynamic reservations the
                                   master asked the agent to keep (reservations.py)
=========  ======================  ==========================================================

Two-part keys are ``f"{len(a)}:{a}/{b}"`` (unambiguous whatever the ids hold). The agent record
also holds the highest master epoch seen. Everything else (peers, timers, registration progress)
is rebuilt or restarted on recovery.

Changes are tracked as they happen (``AgentState.dirty_*`` and the update manager's own set), so
a checkpoint costs O(records changed), and a record is rewritten only when it changed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, TypeVar

from agora.agent.core.state import (
    AgentState,
    Executor,
    ExecutorState,
    Framework,
    QueuedLaunch,
    Task,
)
from agora.sdk.codec import pack_record, unpack_record
from agora.sdk.errors import ProtocolError
from agora.sdk.ids import AgentID, ExecutorID, FrameworkID, TaskID
from agora.sdk.messages import (
    ExecutorInfo,
    FrameworkInfo,
    MaxItems,
    PersistentVolume,
    Range,
    Reason,
    Record,
    TaskInfo,
    TaskState,
    TaskStatus,
)
from agora.sdk.resources import Resources
from msgspec.structs import replace

__all__ = [
    "AGENT",
    "EXECUTOR",
    "FRAMEWORK",
    "KINDS",
    "RESOURCES",
    "STREAM",
    "TASK",
    "AgentRecord",
    "CheckpointError",
    "Delete",
    "ExecutorRecord",
    "FrameworkRecord",
    "LaunchRecord",
    "Put",
    "ResourcesRecord",
    "StreamRecord",
    "TaskRecord",
    "collect",
    "decode",
    "everything",
    "mark_saved",
    "pair_key",
]

AGENT, FRAMEWORK, EXECUTOR, TASK, STREAM = "agent", "framework", "executor", "task", "stream"
LAUNCH = "launch"
RESOURCES = "resources"
KINDS = frozenset({AGENT, FRAMEWORK, EXECUTOR, TASK, STREAM, LAUNCH, RESOURCES})
_AGENT_KEY = "id"
_RESOURCES_KEY = "checkpointed"
_MANY = 1_000_000

R = TypeVar("R", bound=Record)


@dataclass(frozen=True, slots=True)
class Put:
    kind: str
    key: str
    value: bytes


@dataclass(frozen=True, slots=True)
class Delete:
    kind: str
    key: str


class CheckpointError(ValueError):
    """A checkpoint record that cannot be read back."""


class AgentRecord(Record, frozen=True, kw_only=True):
    agent_id: AgentID
    #: The highest master epoch seen: after a restart, a deposed master still cannot command.
    master_epoch: Annotated[int, Range(0, 2**63 - 1)] = 0


class ResourcesRecord(Record, frozen=True, kw_only=True):
    #: The agent's dynamic reservations, as the master's last CHECKPOINT_RESOURCES gave them.
    resources: Resources
    #: Its persistent volumes, likewise.
    volumes: Annotated[tuple[PersistentVolume, ...], MaxItems(4096)] = ()


class FrameworkRecord(Record, frozen=True, kw_only=True):
    info: FrameworkInfo
    terminating: bool = False


class LaunchRecord(Record, frozen=True, kw_only=True):
    """Tasks waiting for an executor, a record of its own (kind ``launch``)."""

    task_ids: Annotated[tuple[TaskID, ...], MaxItems(_MANY)]
    group: bool
    seq: int
    framework_id: FrameworkID
    executor_id: ExecutorID
    #: Waiting for the executor after this one (its current run is terminating).
    successor: bool


class ExecutorRecord(Record, frozen=True, kw_only=True):
    framework_id: FrameworkID
    info: ExecutorInfo
    builtin: bool
    state: ExecutorState
    shutdown_requested: bool = False
    queued: Annotated[tuple[LaunchRecord, ...], MaxItems(_MANY)] = ()
    successor: Annotated[tuple[LaunchRecord, ...], MaxItems(_MANY)] = ()
    exit_reason: Reason | None = None
    exit_message: str = ""
    #: Its secret (executor_auth.py), so that a restarted agent still knows it ("": none).
    secret: str = ""


class TaskRecord(Record, frozen=True, kw_only=True):
    framework_id: FrameworkID
    info: TaskInfo
    executor_id: ExecutorID
    role: str
    state: TaskState
    launched: bool
    #: Being killed for exceeding a limit of its container: the reason and message it ends with.
    limitation_reason: Reason | None = None
    limitation_message: str = ""
    #: The GPUs (indices) it holds (gpus.py); an agent that kept them in gpus.json wrote none.
    gpus: Annotated[tuple[Annotated[int, Range(0, 2**31 - 1)], ...], MaxItems(4096)] = ()
    #: Being killed by the master for a reason of its own (reclaim): its KILLED update's reason.
    kill_reason: Reason | None = None


class StreamRecord(Record, frozen=True, kw_only=True):
    framework_id: FrameworkID
    task_id: TaskID
    pending: Annotated[tuple[TaskStatus, ...], MaxItems(_MANY)]
    seen: Annotated[tuple[bytes, ...], MaxItems(_MANY)]
    terminated: bool


def pair_key(a: str, b: str) -> str:
    return f"{len(a)}:{a}/{b}"


# --- encoding --------------------------------------------------------------------------------


def _framework(fw: Framework) -> bytes:
    return pack_record(FrameworkRecord(info=fw.info, terminating=fw.terminating))


def _executor(ex: Executor) -> bytes:
    state = ex.recovered_from if ex.state is ExecutorState.RECOVERING else ex.state
    assert state is not None
    return pack_record(
        ExecutorRecord(
            framework_id=ex.framework_id,
            info=ex.info,
            builtin=ex.builtin,
            state=state,
            shutdown_requested=ex.shutdown_requested,
            exit_reason=ex.exit_reason,
            exit_message=ex.exit_message,
            secret=ex.secret,
        )
    )


def _launches(ex: Executor) -> dict[str, tuple[QueuedLaunch, bool]]:
    """The executor's waiting launches by record key, each with whether it is a successor."""
    prefix = pair_key(ex.framework_id, ex.executor_id)
    out = {f"{prefix}/0/{q.seq}": (q, False) for q in ex.queued}
    out.update((f"{prefix}/1/{q.seq}", (q, True)) for q in ex.successor)
    return out


def _launch(ex: Executor, launch: QueuedLaunch, successor: bool) -> bytes:
    return pack_record(
        LaunchRecord(
            task_ids=launch.task_ids,
            group=launch.group,
            seq=launch.seq,
            framework_id=ex.framework_id,
            executor_id=ex.executor_id,
            successor=successor,
        )
    )


def _task(task: Task) -> bytes:
    return pack_record(
        TaskRecord(
            framework_id=task.framework_id,
            info=task.info,
            executor_id=task.executor_id,
            role=task.role,
            state=task.state,
            launched=task.launched,
            limitation_reason=task.limitation[0] if task.limitation else None,
            limitation_message=task.limitation[1] if task.limitation else "",
            gpus=task.gpus,
            kill_reason=task.kill_reason,
        )
    )


def _stream(st: AgentState, fid: FrameworkID, tid: TaskID) -> bytes | None:
    dumped = st.updates.dump(fid, tid)
    if dumped is None:
        return None
    pending, seen, terminated = dumped
    record = StreamRecord(
        framework_id=fid,
        task_id=tid,
        pending=pending,
        seen=tuple(sorted(seen)),
        terminated=terminated,
    )
    return pack_record(record)


def _agent(st: AgentState) -> bytes:
    assert st.agent_id is not None
    return pack_record(AgentRecord(agent_id=st.agent_id, master_epoch=st.master_epoch))


def _resources(st: AgentState) -> Put | Delete:
    if not st.checkpointed_resources and not st.checkpointed_volumes:
        return Delete(RESOURCES, _RESOURCES_KEY)
    record = ResourcesRecord(resources=st.checkpointed_resources, volumes=st.checkpointed_volumes)
    value = pack_record(record)
    return Put(RESOURCES, _RESOURCES_KEY, value)


def collect(st: AgentState) -> list[Put | Delete]:
    """The records changed since the last call (written or deleted), and forget the changes."""
    out: list[Put | Delete] = []
    if st.dirty_agent and st.agent_id is not None:
        out.append(Put(AGENT, _AGENT_KEY, _agent(st)))
    if st.dirty_resources:
        out.append(_resources(st))
    for fid in sorted(st.dirty_frameworks):
        fw = st.frameworks.get(fid)
        out.append(Delete(FRAMEWORK, fid) if fw is None else Put(FRAMEWORK, fid, _framework(fw)))
    for fid, eid in sorted(st.dirty_executors):
        key = pair_key(fid, eid)
        ex = st.executors.get((fid, eid))
        out.append(Delete(EXECUTOR, key) if ex is None else Put(EXECUTOR, key, _executor(ex)))
        saved = st.saved_launches.pop((fid, eid), set())
        launches = _launches(ex) if ex is not None else {}
        out += [Delete(LAUNCH, k) for k in sorted(saved - launches.keys())]
        if ex is not None:
            fresh = [(k, q, succ) for k, (q, succ) in launches.items() if k not in saved]
            out += [Put(LAUNCH, k, _launch(ex, q, succ)) for k, q, succ in fresh]
        if launches:
            st.saved_launches[(fid, eid)] = set(launches)
    for fid, tid in sorted(st.dirty_tasks):
        key = pair_key(fid, tid)
        task = st.tasks.get((fid, tid))
        out.append(Delete(TASK, key) if task is None else Put(TASK, key, _task(task)))
    for fid, tid in sorted(st.updates.take_dirty()):
        key = pair_key(fid, tid)
        value = _stream(st, fid, tid)
        out.append(Delete(STREAM, key) if value is None else Put(STREAM, key, value))
    st.dirty_agent = False
    st.dirty_resources = False
    st.dirty_frameworks.clear()
    st.dirty_executors.clear()
    st.dirty_tasks.clear()
    return out


def mark_saved(st: AgentState) -> None:
    """The state was just rebuilt from a checkpoint: its launch records are the saved ones."""
    st.saved_launches = {key: set(_launches(ex)) for key, ex in st.executors.items()}
    st.saved_launches = {key: keys for key, keys in st.saved_launches.items() if keys}
    seqs = [q.seq for ex in st.executors.values() for q in (*ex.queued, *ex.successor)]
    st.launch_seq = max([st.launch_seq, *seqs])


def everything(st: AgentState) -> dict[tuple[str, str], bytes]:
    """Every durable record of the state as it is now (what the checkpoints add up to)."""
    out: dict[tuple[str, str], bytes] = {}
    if st.agent_id is not None:
        out[(AGENT, _AGENT_KEY)] = _agent(st)
    resources = _resources(st)
    if isinstance(resources, Put):
        out[(RESOURCES, _RESOURCES_KEY)] = resources.value
    for fid, fw in st.frameworks.items():
        out[(FRAMEWORK, fid)] = _framework(fw)
    for (fid, eid), ex in st.executors.items():
        out[(EXECUTOR, pair_key(fid, eid))] = _executor(ex)
        for key, (launch, successor) in _launches(ex).items():
            out[(LAUNCH, key)] = _launch(ex, launch, successor)
    for (fid, tid), task in st.tasks.items():
        out[(TASK, pair_key(fid, tid))] = _task(task)
    for fid, tid in st.updates:
        value = _stream(st, fid, tid)
        if value is not None:
            out[(STREAM, pair_key(fid, tid))] = value
    return out


# --- decoding --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Decoded:
    agent_id: AgentID | None
    frameworks: list[FrameworkRecord]
    executors: list[ExecutorRecord]
    tasks: list[TaskRecord]
    streams: list[StreamRecord]
    master_epoch: int = 0
    checkpointed_resources: Resources = field(default_factory=Resources)
    checkpointed_volumes: tuple[PersistentVolume, ...] = ()


def _unpack(cls: type[R], kind: str, key: str, value: bytes) -> R:
    try:
        return unpack_record(cls, value)
    except ProtocolError as exc:
        raise CheckpointError(f"checkpoint record {kind} {key!r} is unreadable: {exc}") from None


def decode(records: Mapping[tuple[str, str], bytes]) -> Decoded:
    """Read the records back (kinds other than the agent's are ignored: the shell's own)."""
    out = Decoded(None, [], [], [], [])
    agent_id = None
    master_epoch = 0
    checkpointed = ResourcesRecord(resources=Resources())
    launches: dict[tuple[str, str], list[LaunchRecord]] = {}
    for (kind, key), value in sorted(records.items()):
        if kind == LAUNCH:
            launch = _unpack(LaunchRecord, kind, key, value)
            launches.setdefault((launch.framework_id, launch.executor_id), []).append(launch)
        elif kind == AGENT:
            agent = _unpack(AgentRecord, kind, key, value)
            agent_id, master_epoch = agent.agent_id, agent.master_epoch
        elif kind == FRAMEWORK:
            out.frameworks.append(_unpack(FrameworkRecord, kind, key, value))
        elif kind == EXECUTOR:
            out.executors.append(_unpack(ExecutorRecord, kind, key, value))
        elif kind == TASK:
            out.tasks.append(_unpack(TaskRecord, kind, key, value))
        elif kind == STREAM:
            out.streams.append(_unpack(StreamRecord, kind, key, value))
        elif kind == RESOURCES:
            checkpointed = _unpack(ResourcesRecord, kind, key, value)
    if agent_id is None and (out.frameworks or out.executors or out.tasks or out.streams):
        raise CheckpointError("checkpoint has records but no agent id")
    executors = []
    for er in out.executors:
        mine = sorted(launches.get((er.framework_id, er.info.executor_id), ()), key=_by_seq)
        executors.append(
            replace(
                er,
                queued=tuple(q for q in mine if not q.successor),
                successor=tuple(q for q in mine if q.successor),
            )
        )
    return Decoded(
        agent_id,
        out.frameworks,
        executors,
        out.tasks,
        out.streams,
        master_epoch,
        checkpointed.resources,
        checkpointed.volumes,
    )


def _by_seq(launch: LaunchRecord) -> int:
    return launch.seq
