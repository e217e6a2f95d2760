"""Several status updates or acknowledgements in one message, where both ends understand it.

Under load a task's updates and their acknowledgements are most of the messages a master, its
agents and its frameworks exchange: two updates a task, each forwarded once and acknowledged
twice. A sender that has several of them queued for one peer sends them as one batch message
(``UPDATES``, ``ACKNOWLEDGEMENTS``, ``STATUS_UPDATES``, ``STATUS_UPDATE_ACKS``), and the receiver
takes the batch apart into the single messages it already handles, in order. The handling of
each update is unchanged: only the framing is shared.

A peer announces that it reads batches with the :data:`BATCHES` feature (``Subscribe.features``,
``RegisterAgent.features``, ``MasterInfo.features``); nothing is batched towards a peer that did
not, so older peers keep talking. Both functions here are pure.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Final

from agora.sdk.messages import (
    Acknowledge,
    Acknowledgements,
    Message,
    StatusUpdateAck,
    StatusUpdateAcks,
    StatusUpdateMessage,
    StatusUpdates,
    TaskStatus,
    Update,
    Updates,
)
from agora.sdk.messages.common import MAX_BATCH_ITEMS

__all__ = ["BATCHES", "FEATURES", "MAX_ITEM_BYTES", "RETRY_REGISTRATION", "coalesce", "unbatch"]

#: The feature a peer names to say it reads batch messages.
BATCHES: Final = "batches"
#: The feature an agent names to say it reads RETRY_REGISTRATION (older agents are not put off).
RETRY_REGISTRATION: Final = "retry_registration"
#: Every feature this version understands (what it announces).
FEATURES: Final = (BATCHES, RETRY_REGISTRATION)
#: An update whose message and data together are larger than this travels alone, so that no
#: batch comes near the frame limit (256 items of at most this size stay under 2 MiB).
MAX_ITEM_BYTES: Final = 4096


def unbatch(message: Message) -> Sequence[Message]:
    """The single messages ``message`` carries, in order (itself alone if it is no batch)."""
    kind = type(message)
    if kind is Updates:
        assert isinstance(message, Updates)
        return [Update(status=status) for status in message.statuses]
    if kind is StatusUpdates:
        assert isinstance(message, StatusUpdates)
        return [StatusUpdateMessage(update=update) for update in message.updates]
    if kind is Acknowledgements:
        assert isinstance(message, Acknowledgements)
        return message.acks
    if kind is StatusUpdateAcks:
        assert isinstance(message, StatusUpdateAcks)
        return message.acks
    return (message,)


def _small(status: TaskStatus) -> bool:
    return len(status.message) + len(status.data) <= MAX_ITEM_BYTES


def _batchable(message: Message) -> type[Message] | None:
    """The kind of run ``message`` may join, or None if it always travels alone."""
    kind = type(message)
    if kind is Update:
        assert isinstance(message, Update)
        return Update if _small(message.status) else None
    if kind is StatusUpdateMessage:
        assert isinstance(message, StatusUpdateMessage)
        return StatusUpdateMessage if _small(message.update.status) else None
    if kind is Acknowledge or kind is StatusUpdateAck:
        return kind
    return None


def _merge(kind: type[Message], run: list[Message]) -> Message:
    if len(run) == 1:
        return run[0]  # alone: the plain message, as an older peer would have had it
    if kind is Update:
        return Updates(statuses=tuple(m.status for m in run))  # type: ignore[attr-defined]
    if kind is StatusUpdateMessage:
        return StatusUpdates(updates=tuple(m.update for m in run))  # type: ignore[attr-defined]
    if kind is Acknowledge:
        return Acknowledgements(acks=tuple(run))  # type: ignore[arg-type]
    return StatusUpdateAcks(acks=tuple(run))  # type: ignore[arg-type]


def coalesce(messages: Iterable[Message]) -> list[Message]:
    """``messages`` (all for one peer that reads batches) with each run of consecutive updates,
    or of consecutive acknowledgements, of one kind merged into one batch message.

    Order is kept: a message of another kind ends the run before it, and a run is cut every
    :data:`MAX_BATCH_ITEMS` items. A run of one stays the plain message."""
    out: list[Message] = []
    run: list[Message] = []
    run_kind: type[Message] | None = None
    for message in messages:
        kind = _batchable(message)
        if run and (kind is not run_kind or len(run) == MAX_BATCH_ITEMS):
            assert run_kind is not None
            out.append(_merge(run_kind, run))
            run = []
        if kind is None:
            out.append(message)
            run_kind = None
        else:
            run.append(message)
            run_kind = kind
    if run:
        assert run_kind is not None
        out.append(_merge(run_kind, run))
    return out
