"""The status-update manager: reliable, in-order delivery of task status updates to the master.

As Mesos's task status update manager does (src/slave/task_status_update_manager.cpp):

* one stream per task, keyed by (framework id, task id);
* only the stream's head is forwarded; the next update goes out once the head is acknowledged
  (STATUS_UPDATE_ACK naming exactly its uuid). An acknowledgement of any other uuid is ignored;
* the head is re-sent after ``retry`` seconds, the delay doubling up to ``retry_max``, until it
  is acknowledged;
* each forward carries ``latest_state``, the state of the newest queued update, so that the
  master frees a task's resources as soon as the task is over, before the earlier updates are
  acknowledged;
* an update whose uuid the stream has already received is a duplicate and is ignored; so is
  any update after the stream's final one (FINISHED, FAILED, KILLED, ERROR, DROPPED, GONE or
  LOST): a task never leaves a final state;
* the stream ends when its final update is acknowledged;
* while paused (the agent is not registered) nothing is sent; ``resume`` re-sends every head at
  once with a fresh backoff.

The manager is pure: it reads no clock and sends nothing. Forwards accumulate in ``outbox``;
the owner drains it with ``take()`` after each call. Streams whose durable part (pending updates,
seen uuids, terminated) changed are collected for the agent's checkpoint (``take_dirty``, ``dump``)
and come back with ``restore`` after a restart; timers are not durable.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field

from agora.sdk.ids import FrameworkID, TaskID
from agora.sdk.messages import (
    StatusUpdate,
    StatusUpdateMessage,
    TaskStatus,
    is_final,
)

__all__ = ["StatusUpdateManager", "StreamKey", "is_final"]

StreamKey = tuple[FrameworkID, TaskID]


@dataclass(slots=True)
class _Stream:
    framework_id: FrameworkID
    task_id: TaskID
    pending: deque[TaskStatus] = field(default_factory=deque)
    #: Every uuid this stream ever received (pending or acknowledged): duplicates are ignored.
    seen: set[bytes] = field(default_factory=set)
    #: A final update is queued; nothing may follow it.
    terminated: bool = False
    backoff: float = 0.0
    #: When the head is re-sent next; None while nothing is in flight.
    due: float | None = None
    #: Bumped whenever ``due`` changes, so that stale timer entries are skipped.
    token: int = 0


class StatusUpdateManager:
    """Streams of status updates, one per task; see the module docstring for the rules."""

    def __init__(self, retry: float, retry_max: float, *, active: bool = False) -> None:
        if retry <= 0 or retry_max < retry:
            raise ValueError("need 0 < retry <= retry_max")
        self._retry = retry
        self._retry_max = retry_max
        self._active = active
        self._streams: dict[StreamKey, _Stream] = {}
        self._timers: list[tuple[float, int, StreamKey, int]] = []
        self._seq = 0
        self.outbox: list[StatusUpdateMessage] = []
        self._dirty: set[StreamKey] = set()

    # --- stimuli -------------------------------------------------------------------------
    def update(self, framework_id: FrameworkID, status: TaskStatus, now: float) -> bool:
        """Queue ``status`` (which must carry a uuid) on its task's stream; forward it at once if
        it is the head. False if it was ignored (a duplicate, or after the final update)."""
        uuid = status.uuid
        if uuid is None:
            raise ValueError("a reliable status update needs a uuid")
        key = (framework_id, status.task_id)
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = _Stream(framework_id, status.task_id)
        elif stream.terminated or uuid in stream.seen:
            return False
        stream.seen.add(uuid)
        stream.pending.append(status)
        self._dirty.add(key)
        if is_final(status.state):
            stream.terminated = True
        if len(stream.pending) == 1:
            self._send_head(stream, now)
        return True

    def acknowledge(
        self, framework_id: FrameworkID, task_id: TaskID, uuid: bytes, now: float
    ) -> TaskStatus | None:
        """The master acknowledged ``uuid``. Returns the acknowledged update if ``uuid`` was the
        head (the next update, if any, is forwarded), else None and nothing changes. After the
        final update is acknowledged the stream is gone."""
        key = (framework_id, task_id)
        stream = self._streams.get(key)
        if stream is None or not stream.pending or stream.pending[0].uuid != uuid:
            return None
        acked = stream.pending.popleft()
        self._dirty.add(key)
        stream.token += 1
        stream.due = None
        if stream.pending:
            self._send_head(stream, now)
        elif stream.terminated:
            del self._streams[key]
        return acked

    def tick(self, now: float) -> None:
        """Re-send every head whose retry time has come, doubling its backoff (capped)."""
        if not self._active:
            return
        timers = self._timers
        while timers and timers[0][0] <= now:
            _due, _seq, key, token = heapq.heappop(timers)
            stream = self._streams.get(key)
            if stream is None or stream.token != token or not stream.pending:
                continue
            stream.backoff = min(stream.backoff * 2, self._retry_max)
            self._forward(stream, now)

    def pause(self) -> None:
        """Stop forwarding (the agent is not registered). Updates keep queueing."""
        self._active = False
        self._timers.clear()
        for stream in self._streams.values():
            stream.due = None
            stream.token += 1

    def resume(self, now: float) -> None:
        """Forward again: re-send every stream's head now, each with a fresh backoff."""
        self._active = True
        self._timers.clear()
        for stream in self._streams.values():
            stream.token += 1
            if stream.pending:
                self._send_head(stream, now)

    def remove(self, framework_id: FrameworkID, task_id: TaskID) -> None:
        """Drop a task's stream, acknowledged or not."""
        if self._streams.pop((framework_id, task_id), None) is not None:
            self._dirty.add((framework_id, task_id))

    def remove_framework(self, framework_id: FrameworkID) -> None:
        """Drop every stream of a framework (it was shut down: nobody will acknowledge them)."""
        for key in [k for k in self._streams if k[0] == framework_id]:
            del self._streams[key]
            self._dirty.add(key)

    def take(self) -> list[StatusUpdateMessage]:
        """The forwards queued since the last call, oldest first."""
        out, self.outbox = self.outbox, []
        return out

    # --- checkpointing -------------------------------------------------------------------
    def take_dirty(self) -> set[StreamKey]:
        """The streams changed (or gone) since the last call."""
        out, self._dirty = self._dirty, set()
        return out

    def dump(
        self, framework_id: FrameworkID, task_id: TaskID
    ) -> tuple[tuple[TaskStatus, ...], frozenset[bytes], bool] | None:
        """The durable part of a stream (pending updates, seen uuids, terminated); None: gone."""
        stream = self._streams.get((framework_id, task_id))
        if stream is None:
            return None
        return tuple(stream.pending), frozenset(stream.seen), stream.terminated

    def restore(
        self,
        framework_id: FrameworkID,
        task_id: TaskID,
        pending: tuple[TaskStatus, ...],
        seen: frozenset[bytes],
        terminated: bool,
    ) -> None:
        """Bring back a stream from a checkpoint, while paused: its head goes out on ``resume``
        with a fresh backoff."""
        if self._active:
            raise RuntimeError("restore streams before the manager is resumed")
        stream = _Stream(framework_id, task_id, deque(pending), set(seen), terminated)
        stream.seen.update(s.uuid for s in pending if s.uuid is not None)
        stream.backoff = self._retry
        self._streams[(framework_id, task_id)] = stream

    # --- views ---------------------------------------------------------------------------
    @property
    def active(self) -> bool:
        return self._active

    def head(self, framework_id: FrameworkID, task_id: TaskID) -> TaskStatus | None:
        """The update in flight for the task (the oldest unacknowledged one), if any."""
        stream = self._streams.get((framework_id, task_id))
        return stream.pending[0] if stream is not None and stream.pending else None

    def pending(self, framework_id: FrameworkID, task_id: TaskID) -> tuple[TaskStatus, ...]:
        """The task's unacknowledged updates, oldest first."""
        stream = self._streams.get((framework_id, task_id))
        return tuple(stream.pending) if stream is not None else ()

    def next_retry(self, framework_id: FrameworkID, task_id: TaskID) -> float | None:
        """When the task's head is re-sent next (None: nothing in flight, or paused)."""
        stream = self._streams.get((framework_id, task_id))
        return stream.due if stream is not None else None

    def unacknowledged(self) -> int:
        """How many updates wait for an acknowledgement, over all streams."""
        return sum(len(s.pending) for s in self._streams.values())

    def __contains__(self, key: object) -> bool:
        return key in self._streams

    def __iter__(self) -> Iterator[StreamKey]:
        return iter(list(self._streams))

    def __len__(self) -> int:
        return len(self._streams)

    # --- internals -----------------------------------------------------------------------
    def _send_head(self, stream: _Stream, now: float) -> None:
        """A new head (or a resumed one): forward it now with the initial backoff."""
        stream.backoff = self._retry
        if self._active:
            self._forward(stream, now)

    def _forward(self, stream: _Stream, now: float) -> None:
        self.outbox.append(
            StatusUpdateMessage(
                update=StatusUpdate(
                    framework_id=stream.framework_id,
                    status=stream.pending[0],
                    latest_state=stream.pending[-1].state,
                )
            )
        )
        stream.token += 1
        stream.due = now + stream.backoff
        self._seq += 1
        heapq.heappush(
            self._timers,
            (stream.due, self._seq, (stream.framework_id, stream.task_id), stream.token),
        )
